//! `deploy/scheduler-ext/make-certificate.sh` makes what docs/install.md says (L-8 of the
//! 2026-11-26 review): ECDSA P-256 keys; a CA that can sign only end certificates
//! (`CA:TRUE, pathlen:0`, `keyCertSign, cRLSign`) for the Service's names (name constraints);
//! a serving certificate for exactly the names cert-manager's Certificate asks for; and
//! `--cluster-ip` taken only as an IP address. The script is run for real (openssl).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::manifests::{deploy_dir, find};

const SERVICE: &str = "ipkeep-scheduler-ext.ipkeep-system.svc";

fn make_certificate(out: &Path, cluster_ip: &str) -> std::process::Output {
    Command::new(deploy_dir().join("scheduler-ext/make-certificate.sh"))
        .args(["--files-only", "--out"])
        .arg(out)
        .args(["--cluster-ip", cluster_ip])
        .output()
        .expect("run make-certificate.sh")
}

fn der(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).expect("a PEM certificate")
}

/// The P-256 curve's OID (1.2.840.10045.3.1.7), as the key's algorithm parameter.
fn is_p256(cert: &X509Certificate<'_>) -> bool {
    let spki = cert.public_key();
    spki.algorithm.algorithm.to_id_string() == "1.2.840.10045.2.1"
        && spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .is_some_and(|oid| oid.to_id_string() == "1.2.840.10045.3.1.7")
}

#[test]
fn make_certificate_makes_a_constrained_p256_ca_and_the_services_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("pki");
    let made = make_certificate(&out, "10.96.0.50");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (ca_der, leaf_der) = (der(&out.join("ca.crt")), der(&out.join("tls.crt")));
    let (_, ca) = X509Certificate::from_der(&ca_der).expect("the CA");
    let (_, leaf) = X509Certificate::from_der(&leaf_der).expect("the serving certificate");
    assert!(is_p256(&ca) && is_p256(&leaf), "ECDSA P-256 keys");

    let constraints = ca
        .basic_constraints()
        .expect("one")
        .expect("basicConstraints");
    assert!(constraints.critical && constraints.value.ca);
    assert_eq!(constraints.value.path_len_constraint, Some(0));
    let usage = ca.key_usage().expect("one").expect("keyUsage");
    assert!(usage.critical && usage.value.key_cert_sign() && usage.value.crl_sign());
    assert!(!usage.value.digital_signature() && !usage.value.key_encipherment());
    let permitted: Vec<String> = ca
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::NameConstraints(nc) => Some(nc.permitted_subtrees.clone()),
            _ => None,
        })
        .expect("name constraints")
        .unwrap_or_default()
        .iter()
        .map(|t| match &t.base {
            GeneralName::DNSName(n) => n.to_string(),
            other => format!("{other:?}"),
        })
        .collect();

    // The serving certificate names exactly what cert-manager's Certificate names, and the
    // CA may sign exactly those.
    let cert_manager = find("Certificate", "ipkeep-scheduler-ext");
    let mut wanted: Vec<String> = cert_manager.value["spec"]["dnsNames"]
        .as_array()
        .expect("dnsNames")
        .iter()
        .map(|n| n.as_str().expect("a name").to_string())
        .collect();
    wanted.sort();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for name in &leaf
        .subject_alternative_name()
        .expect("one")
        .expect("SANs")
        .value
        .general_names
    {
        match name {
            GeneralName::DNSName(n) => dns.push(n.to_string()),
            GeneralName::IPAddress(ip) => ips.push(ip.to_vec()),
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    dns.sort();
    let mut permitted_sorted = permitted.clone();
    permitted_sorted.sort();
    assert_eq!(dns, wanted, "the serving certificate's names");
    assert_eq!(permitted_sorted, wanted, "the CA's name constraints");
    assert_eq!(ips, vec![vec![10u8, 96, 0, 50]], "the --cluster-ip");
    let leaf_constraints = leaf
        .basic_constraints()
        .expect("one")
        .expect("basicConstraints");
    assert!(!leaf_constraints.value.ca);
    for key in ["ipkeep-ca", "ipkeep-scheduler-ext"] {
        let key_spec = &find("Certificate", key).value["spec"]["privateKey"];
        assert_eq!(
            (key_spec["algorithm"].as_str(), key_spec["size"].as_i64()),
            (Some("ECDSA"), Some(256)),
            "cert-manager's {key} uses the same keys"
        );
    }
    let ca_usages = &find("Certificate", "ipkeep-ca").value["spec"]["usages"];
    assert_eq!(ca_usages, &serde_json::json!(["cert sign", "crl sign"]));

    // A TLS client (rustls: webpki, which checks name constraints as Go's crypto/x509 does)
    // accepts it for the Service's name.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_der.clone()).expect("a root");
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .expect("a verifier");
    verifier
        .verify_server_cert(
            &leaf_der,
            &[],
            &ServerName::try_from(SERVICE).expect("a name"),
            &[],
            UnixTime::now(),
        )
        .expect("the serving certificate verifies for the Service's name");

    // The CA's key cannot make a certificate for another name that a client accepts.
    std::fs::write(
        out.join("evil.ext"),
        "subjectAltName=DNS:kubernetes.default.svc\n",
    )
    .expect("write");
    let signed = Command::new("sh")
        .arg("-c")
        .arg(
            "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=evil \
             -keyout evil.key -out evil.csr && openssl x509 -req -in evil.csr -CA ca.crt \
             -CAkey ca.key -CAcreateserial -days 1 -extfile evil.ext -out evil.crt",
        )
        .current_dir(&out)
        .output()
        .expect("openssl");
    assert!(
        signed.status.success(),
        "{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    let evil = verifier.verify_server_cert(
        &der(&out.join("evil.crt")),
        &[],
        &ServerName::try_from("kubernetes.default.svc").expect("a name"),
        &[],
        UnixTime::now(),
    );
    assert!(evil.is_err(), "a certificate for another name was accepted");
}

#[test]
fn make_certificate_takes_only_an_ip_address_as_cluster_ip() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (ip, ok) in [
        ("10.96.0.50", true),
        ("fd00:10:96::50", true),
        ("1.2.3", false),
        ("256.1.1.1", false),
        ("10.96.0.050", false),
        ("1::2::3", false),
        ("10.96.0.50,DNS:evil.example", false),
        ("example.com", false),
    ] {
        let made = make_certificate(&dir.path().join(ip.replace([':', ','], "_")), ip);
        assert_eq!(
            made.status.success(),
            ok,
            "--cluster-ip {ip}: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
}
