//! Webhook certificates that manage themselves, as pure decisions: given what the Secret holds
//! and the time, the CA, serving certificate and caBundle it should hold. The caller reads and
//! writes the Secret and the webhook configurations; nothing here does I/O (keys are generated
//! here, from the system's randomness).
//!
//! The Secret holds four keys: [`CA_CERT`] (the bundle: the CA in use first, then earlier CAs
//! until they expire, so that a serving certificate of the earlier CA, still mounted in a pod
//! for up to a kubelet sync period, keeps being trusted), [`CA_KEY`], [`TLS_CERT`] and
//! [`TLS_KEY`] (the `kubernetes.io/tls` pair the webhook server mounts). A certificate is
//! renewed once less than a third of its lifetime is left, so a renewal that keeps failing has
//! that third to be noticed before anything expires.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData,
};
use time::OffsetDateTime;
use x509_parser::pem::Pem;

/// The CA bundle: the CA in use first, then earlier CAs not yet expired.
pub const CA_CERT: &str = "ca.crt";
/// The key of the CA in use.
pub const CA_KEY: &str = "ca.key";
/// The serving certificate.
pub const TLS_CERT: &str = "tls.crt";
/// The serving certificate's key.
pub const TLS_KEY: &str = "tls.key";

/// What a Secret's `data` holds.
pub type SecretData = BTreeMap<String, Vec<u8>>;

/// How far back a new certificate's validity starts, for clocks a little behind ours.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// What the certificates are for and how long they last.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The names the serving certificate is for (the webhook Service's DNS names).
    pub dns_names: Vec<String>,
    /// A new CA's lifetime.
    pub ca_validity: Duration,
    /// A new serving certificate's lifetime (never past its CA's end).
    pub cert_validity: Duration,
}

/// Why the Secret must be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new CA and a serving certificate from it; why.
    NewCa(String),
    /// A new serving certificate from the CA in use; why.
    NewCertificate(String),
    /// An expired earlier CA dropped from the bundle.
    BundleTrimmed,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NewCa(why) => write!(f, "new CA and serving certificate: {why}"),
            Self::NewCertificate(why) => write!(f, "new serving certificate: {why}"),
            Self::BundleTrimmed => f.write_str("an expired earlier CA dropped from the bundle"),
        }
    }
}

/// What the Secret must hold, and when to look again.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The Secret's data.
    pub data: SecretData,
    /// Why it differs from what it held; `None` when it is what it held.
    pub change: Option<Change>,
    /// The `caBundle` of every webhook configuration (the same bytes as `data[CA_CERT]`).
    pub ca_bundle: Vec<u8>,
    /// When to plan again at the latest: the first renewal due.
    pub renew_at: SystemTime,
    /// When the serving certificate expires.
    pub cert_expiry: SystemTime,
    /// When the CA in use expires.
    pub ca_expiry: SystemTime,
}

/// A certificate could not be made.
#[derive(Debug, thiserror::Error)]
#[error("failed to generate a certificate: {0}")]
pub struct Error(#[from] rcgen::Error);

/// One parsed certificate.
#[derive(Debug, Clone)]
struct Cert {
    pem: String,
    subject: String,
    issuer: String,
    dns_names: Vec<String>,
    public_key: Vec<u8>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Cert {
    /// Whether less than a third of its lifetime is left at `now`.
    fn due(&self, now: SystemTime) -> bool {
        now >= self.renewal()
    }

    /// A third of its lifetime before it expires; the lifetime without the backdating of
    /// certificates made here (a certificate made by someone else renews a little later).
    fn renewal(&self) -> SystemTime {
        let lifetime = (self.not_after.duration_since(self.not_before)).unwrap_or_default();
        self.not_after - lifetime.saturating_sub(BACKDATE) / 3
    }
}

/// Decides what the Secret must hold at `now`, given what it holds (`held`, empty when it does
/// not exist).
pub fn plan(held: &SecretData, settings: &Settings, now: SystemTime) -> Result<Plan, Error> {
    let bundle = held
        .get(CA_CERT)
        .map(|b| certificates(b))
        .unwrap_or_default();
    let ca_key = held.get(CA_KEY).and_then(|k| key(k));
    let leaf = held
        .get(TLS_CERT)
        .map(|b| certificates(b))
        .unwrap_or_default();
    let leaf_key = held.get(TLS_KEY).and_then(|k| key(k));
    let earlier: Vec<Cert> = (bundle.iter().skip(1))
        .filter(|c| c.not_after > now)
        .cloned()
        .collect();

    let ca = match usable_ca(bundle.first(), ca_key, now) {
        Ok(ca) => ca,
        Err(why) => {
            // The CA in use stays trusted until it expires: serving certificates it signed
            // may be mounted in pods for a while yet.
            let keep = bundle.first().filter(|c| c.not_after > now).cloned();
            let (ca, ca_key) = new_ca(settings, now)?;
            let rest: Vec<Cert> = keep.into_iter().chain(earlier).collect();
            return signed(ca, ca_key, rest, settings, now, Change::NewCa(why));
        }
    };
    let (ca, ca_key) = ca;
    let trimmed = earlier.len() + 1 < bundle.len();
    match usable_leaf(leaf.first(), leaf_key.as_ref(), &ca, settings, now) {
        Err(why) => signed(
            ca,
            ca_key,
            earlier,
            settings,
            now,
            Change::NewCertificate(why),
        ),
        Ok(cert) => {
            let key_pem = held.get(TLS_KEY).cloned().unwrap_or_default();
            let data = secret_data(&ca, &ca_key, &earlier, &cert.pem, key_pem);
            let change = trimmed.then_some(Change::BundleTrimmed);
            Ok(finish(data, change, &ca, cert, &earlier))
        }
    }
}

/// The CA in use and its key, or why it cannot be used.
fn usable_ca(
    ca: Option<&Cert>,
    key: Option<KeyPair>,
    now: SystemTime,
) -> Result<(Cert, KeyPair), String> {
    let ca = ca.ok_or("no CA")?;
    let key = key.ok_or("no CA key, or not a PEM private key")?;
    if key.subject_public_key_info() != ca.public_key {
        return Err("the CA key does not go with the CA certificate".into());
    }
    if ca.due(now) {
        return Err(format!(
            "the CA is due for renewal (expires {})",
            rfc3339(ca.not_after)
        ));
    }
    Ok((ca.clone(), key))
}

/// The serving certificate, if it can stay, or why not.
fn usable_leaf<'a>(
    leaf: Option<&'a Cert>,
    key: Option<&KeyPair>,
    ca: &Cert,
    settings: &Settings,
    now: SystemTime,
) -> Result<&'a Cert, String> {
    let leaf = leaf.ok_or("no serving certificate")?;
    let key = key.ok_or("no serving key, or not a PEM private key")?;
    if key.subject_public_key_info() != leaf.public_key {
        return Err("the serving key does not go with the certificate".into());
    }
    if leaf.issuer != ca.subject {
        return Err("the serving certificate is not from the CA in use".into());
    }
    if leaf.dns_names != settings.dns_names {
        return Err(format!(
            "the serving certificate is for {:?}, not {:?}",
            leaf.dns_names, settings.dns_names
        ));
    }
    // Shortened by the operator: at once. The margin keeps replicas whose clocks differ by
    // less than the backdating from replacing each other's certificates.
    if leaf.not_after > now + settings.cert_validity + BACKDATE {
        return Err(format!(
            "the serving certificate expires {}, longer than the validity asked for ({} s)",
            rfc3339(leaf.not_after),
            settings.cert_validity.as_secs()
        ));
    }
    if leaf.due(now) {
        return Err(format!(
            "the serving certificate is due for renewal (expires {})",
            rfc3339(leaf.not_after)
        ));
    }
    Ok(leaf)
}

/// A new serving certificate from `ca`, and the plan holding it.
fn signed(
    ca: Cert,
    ca_key: KeyPair,
    earlier: Vec<Cert>,
    settings: &Settings,
    now: SystemTime,
    change: Change,
) -> Result<Plan, Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(settings.dns_names.clone())?;
    if let Some(first) = settings.dns_names.first() {
        params.distinguished_name.push(DnType::CommonName, first);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = at(now - BACKDATE);
    params.not_after = at((now + settings.cert_validity).min(ca.not_after));
    let issuer = Issuer::from_ca_cert_pem(&ca.pem, &ca_key)?;
    let cert_pem = params.signed_by(&key, &issuer)?.pem();
    let Some(cert) = certificates(cert_pem.as_bytes()).into_iter().next() else {
        return Err(Error(rcgen::Error::CouldNotParseCertificate));
    };
    let key_pem = key.serialize_pem().into_bytes();
    let data = secret_data(&ca, &ca_key, &earlier, &cert_pem, key_pem);
    Ok(finish(data, Some(change), &ca, &cert, &earlier))
}

/// A new CA valid from `now` for [`Settings::ca_validity`], named after the second it was made
/// (so a serving certificate names which CA signed it).
fn new_ca(settings: &Settings, now: SystemTime) -> Result<(Cert, KeyPair), Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let made = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    params.distinguished_name.push(
        DnType::CommonName,
        format!(
            "ipkeep-webhook-ca@{}.{:09}",
            made.as_secs(),
            made.subsec_nanos()
        ),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = at(now - BACKDATE);
    params.not_after = at(now + settings.ca_validity);
    let pem = params.self_signed(&key)?.pem();
    match certificates(pem.as_bytes()).into_iter().next() {
        Some(ca) => Ok((ca, key)),
        None => Err(Error(rcgen::Error::CouldNotParseCertificate)),
    }
}

fn secret_data(
    ca: &Cert,
    ca_key: &KeyPair,
    earlier: &[Cert],
    cert_pem: &str,
    key_pem: Vec<u8>,
) -> SecretData {
    SecretData::from([
        (CA_CERT.into(), bundle(ca, earlier)),
        (CA_KEY.into(), ca_key.serialize_pem().into_bytes()),
        (TLS_CERT.into(), cert_pem.as_bytes().to_vec()),
        (TLS_KEY.into(), key_pem),
    ])
}

fn bundle(ca: &Cert, earlier: &[Cert]) -> Vec<u8> {
    let pems = std::iter::once(ca).chain(earlier).map(|c| c.pem.as_str());
    pems.collect::<String>().into_bytes()
}

fn finish(
    data: SecretData,
    change: Option<Change>,
    ca: &Cert,
    cert: &Cert,
    earlier: &[Cert],
) -> Plan {
    let first_expiry = earlier.iter().map(|c| c.not_after).min();
    let renew_at = [Some(ca.renewal()), Some(cert.renewal()), first_expiry]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(ca.renewal());
    Plan {
        ca_bundle: data[CA_CERT].clone(),
        data,
        change,
        renew_at,
        cert_expiry: cert.not_after,
        ca_expiry: ca.not_after,
    }
}

/// The certificates of a PEM bundle that parse (others are skipped: a damaged bundle is
/// replaced, never fatal).
fn certificates(pem: &[u8]) -> Vec<Cert> {
    Pem::iter_from_buffer(pem)
        .flatten()
        .filter_map(|block| {
            let parsed = block.parse_x509().ok()?;
            let dns_names = parsed
                .subject_alternative_name()
                .ok()
                .flatten()
                .map(|san| {
                    (san.value.general_names.iter())
                        .filter_map(|n| match n {
                            x509_parser::extensions::GeneralName::DNSName(d) => {
                                Some((*d).to_string())
                            }
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let time = |t: i64| UNIX_EPOCH + Duration::from_secs(t.max(0).unsigned_abs());
            Some(Cert {
                pem: pem_text(&block.contents),
                subject: parsed.subject().to_string(),
                issuer: parsed.issuer().to_string(),
                dns_names,
                public_key: parsed.public_key().raw.to_vec(),
                not_before: time(parsed.validity().not_before.timestamp()),
                not_after: time(parsed.validity().not_after.timestamp()),
            })
        })
        .collect()
}

/// A certificate's DER as one PEM block.
fn pem_text(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

fn key(pem: &[u8]) -> Option<KeyPair> {
    KeyPair::from_pem(std::str::from_utf8(pem).ok()?).ok()
}

fn at(t: SystemTime) -> OffsetDateTime {
    OffsetDateTime::from(t)
}

/// A time as RFC 3339, for messages.
fn rfc3339(t: SystemTime) -> String {
    let t = OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests;
