use super::*;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn settings() -> Settings {
    Settings {
        dns_names: vec![
            "ipkeep-scheduler-ext.ipkeep-system.svc".into(),
            "ipkeep-scheduler-ext.ipkeep-system.svc.cluster.local".into(),
        ],
        ca_validity: 300 * DAY,
        cert_validity: 30 * DAY,
    }
}

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn one(data: &SecretData, key: &str) -> Cert {
    certificates(&data[key]).remove(0)
}

#[test]
fn an_empty_secret_gets_a_ca_and_a_serving_certificate_from_it_then_stays() {
    let first = plan(&SecretData::new(), &settings(), t0()).expect("plan");
    assert_eq!(first.change, Some(Change::NewCa("no CA".into())));
    assert_eq!(
        first.data.keys().collect::<Vec<_>>(),
        [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY]
    );
    let (ca, leaf) = (one(&first.data, CA_CERT), one(&first.data, TLS_CERT));
    assert_eq!(leaf.issuer, ca.subject);
    assert_eq!(leaf.dns_names, settings().dns_names);
    assert_eq!(first.ca_bundle, first.data[CA_CERT]);
    assert_eq!(certificates(&first.ca_bundle).len(), 1);
    assert_eq!(first.cert_expiry, t0() + 30 * DAY);
    assert_eq!(first.ca_expiry, t0() + 300 * DAY);
    // Renewal once a third of the serving certificate's lifetime (backdating not counted) is
    // left.
    assert_eq!(first.renew_at, t0() + 20 * DAY);

    let again = plan(
        &first.data,
        &settings(),
        first.renew_at - Duration::from_secs(1),
    )
    .expect("plan");
    assert_eq!(again.change, None);
    assert_eq!(again.data, first.data);
}

#[test]
fn a_serving_certificate_due_for_renewal_is_replaced_from_the_same_ca() {
    let first = plan(&SecretData::new(), &settings(), t0()).expect("plan");
    let renewed = plan(&first.data, &settings(), first.renew_at).expect("plan");
    assert!(
        matches!(&renewed.change, Some(Change::NewCertificate(why)) if why.contains("due for renewal")),
        "{:?}",
        renewed.change
    );
    assert_eq!(renewed.data[CA_CERT], first.data[CA_CERT]);
    assert_eq!(renewed.data[CA_KEY], first.data[CA_KEY]);
    assert_ne!(renewed.data[TLS_CERT], first.data[TLS_CERT]);
    assert_ne!(renewed.data[TLS_KEY], first.data[TLS_KEY]);
    assert_eq!(renewed.cert_expiry, first.renew_at + 30 * DAY);
}

#[test]
fn a_ca_due_for_renewal_is_replaced_and_trusted_beside_the_new_one_until_it_expires() {
    // Serving certificates that outlast the old CA, so only the CAs change in this test.
    let settings = || Settings {
        cert_validity: 200 * DAY,
        ..self::settings()
    };
    let first = plan(&SecretData::new(), &settings(), t0()).expect("plan");
    let old_ca = one(&first.data, CA_CERT);
    let due = old_ca.renewal();
    let rotated = plan(&first.data, &settings(), due).expect("plan");
    assert!(
        matches!(&rotated.change, Some(Change::NewCa(why)) if why.contains("CA is due")),
        "{:?}",
        rotated.change
    );
    let bundle = certificates(&rotated.ca_bundle);
    assert_eq!(bundle.len(), 2, "the new CA first, then the old one");
    assert_ne!(bundle[0].subject, old_ca.subject);
    assert_eq!(bundle[1].subject, old_ca.subject);
    assert_eq!(one(&rotated.data, TLS_CERT).issuer, bundle[0].subject);
    // The next look is when the old CA expires, if nothing is due before.
    assert!(rotated.renew_at <= old_ca.not_after);

    // Stable while the old CA lives; dropped once it has expired.
    let later = plan(
        &rotated.data,
        &settings(),
        old_ca.not_after - Duration::from_secs(1),
    )
    .expect("plan");
    assert_eq!(later.change, None);
    let expired = plan(&rotated.data, &settings(), old_ca.not_after).expect("plan");
    assert_eq!(expired.change, Some(Change::BundleTrimmed));
    assert_eq!(certificates(&expired.ca_bundle).len(), 1);
    assert_eq!(expired.data[TLS_CERT], rotated.data[TLS_CERT]);
}

#[test]
fn a_lifetime_shorter_than_the_backdating_is_renewed_a_third_before_its_end() {
    let mut s = settings();
    s.cert_validity = Duration::from_secs(6);
    let first = plan(&SecretData::new(), &s, t0()).expect("plan");
    assert_eq!(first.renew_at, t0() + Duration::from_secs(4));
    let early = plan(&first.data, &s, t0() + Duration::from_secs(3)).expect("plan");
    assert_eq!(early.change, None);
}

#[test]
fn a_serving_certificate_never_outlives_its_ca() {
    let mut s = settings();
    s.ca_validity = 20 * DAY;
    let first = plan(&SecretData::new(), &s, t0()).expect("plan");
    assert_eq!(first.cert_expiry, first.ca_expiry);
}

#[test]
fn damaged_or_mismatched_contents_are_replaced_with_the_reason() {
    let first = plan(&SecretData::new(), &settings(), t0()).expect("plan");
    let other = plan(&SecretData::new(), &settings(), t0() + DAY).expect("plan");
    let with = |key: &str, value: &[u8]| {
        let mut data = first.data.clone();
        data.insert(key.into(), value.to_vec());
        data
    };
    let mut foreign = first.data.clone();
    for key in [TLS_CERT, TLS_KEY] {
        foreign.insert(key.into(), other.data[key].clone());
    }
    let cases: [(SecretData, &str); 7] = [
        (with(CA_CERT, b"not PEM"), "no CA"),
        (
            with(CA_KEY, b"-----BEGIN PRIVATE KEY-----\nxx\n"),
            "no CA key",
        ),
        (with(CA_KEY, &other.data[CA_KEY]), "CA key does not go"),
        (with(TLS_CERT, b""), "no serving certificate"),
        (
            with(TLS_KEY, &other.data[TLS_KEY]),
            "serving key does not go",
        ),
        (foreign, "not from the CA in use"),
        (first.data.clone(), "is for"),
    ];
    for (i, (data, why)) in cases.into_iter().enumerate() {
        let mut s = settings();
        if i == 6 {
            s.dns_names = vec!["renamed.ipkeep-system.svc".into()];
        }
        let replanned = plan(&data, &s, t0() + Duration::from_secs(60)).expect("plan");
        let change = replanned.change.map(|c| c.to_string()).unwrap_or_default();
        assert!(
            change.contains(why),
            "case {i}: {change:?} should say {why:?}"
        );
        let (ca, leaf) = (
            one(&replanned.data, CA_CERT),
            one(&replanned.data, TLS_CERT),
        );
        assert_eq!(leaf.issuer, ca.subject, "case {i}");
        assert_eq!(leaf.dns_names, s.dns_names, "case {i}");
        let again = plan(&replanned.data, &s, t0() + Duration::from_secs(61)).expect("plan");
        assert_eq!(again.change, None, "case {i}: stable once repaired");
    }
}

/// An operator who shortens the serving certificate's validity (--webhook-certificate-validity)
/// gets it at once, not when the longer certificate comes due; the CA stays.
#[test]
fn a_serving_certificate_longer_than_the_validity_now_asked_for_is_replaced() {
    let first = plan(&SecretData::new(), &settings(), t0()).expect("plan");
    let shorter = Settings {
        cert_validity: 2 * DAY,
        ..settings()
    };
    let later = t0() + DAY;
    let replaced = plan(&first.data, &shorter, later).expect("plan");
    assert!(
        matches!(&replaced.change, Some(Change::NewCertificate(why)) if why.contains("longer than")),
        "{:?}",
        replaced.change
    );
    assert_eq!(replaced.cert_expiry, later + 2 * DAY);
    assert_eq!(
        one(&replaced.data, CA_CERT).pem,
        one(&first.data, CA_CERT).pem
    );
    // The new one is not replaced again while it runs its course.
    let again = plan(&replaced.data, &shorter, later + DAY / 2).expect("plan");
    assert_eq!(again.change, None);
    // Lengthening the validity waits for the renewal.
    assert_eq!(
        plan(&replaced.data, &settings(), later + DAY / 2)
            .expect("plan")
            .change,
        None
    );
}
