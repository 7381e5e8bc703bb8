//! `--webhook-certificates` against a real kube-apiserver: two replicas keep one Secret and the
//! caBundle of a Mutating- and a ValidatingWebhookConfiguration, through renewals of the serving
//! certificate and of the CA (lifetimes of seconds), and put back a caBundle someone reset.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ipkeep_controller::certificates::{CertSettings, keep};
use ipkeep_controller::http::Health;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::json;
use support::*;

const SECRET: &str = "webhook-tls";

/// A webhook of `kind` that matches nothing anyone creates (failing open), pointing at the
/// Service `hooks` of `ns`.
fn webhook(ns: &str, kind: &str, name: &str) -> serde_json::Value {
    let mut hook = json!({
        "name": format!("{kind}.ipkeep.dev"),
        "clientConfig": {"service": {"namespace": ns, "name": "hooks", "path": "/x"}},
        "rules": [{"apiGroups": ["ipkeep.dev"], "apiVersions": ["v1alpha1"],
                   "operations": ["DELETE"], "resources": ["persistentpodstates"]}],
        "objectSelector": {"matchLabels": {"never": name}},
        "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"],
    });
    if kind == "mutating" {
        hook["reinvocationPolicy"] = json!("Never");
    }
    json!({"metadata": {"name": name}, "webhooks": [hook]})
}

fn bundle_of(webhooks: Option<Vec<Option<Vec<u8>>>>) -> Vec<Option<Vec<u8>>> {
    webhooks.unwrap_or_default()
}

async fn bundles(client: &kube::Client, name: &str) -> Vec<Option<Vec<u8>>> {
    let m = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    let v = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    let m = m.webhooks.map(|w| {
        w.into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0))
            .collect()
    });
    let v = v.webhooks.map(|w| {
        w.into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0))
            .collect()
    });
    bundle_of(m).into_iter().chain(bundle_of(v)).collect()
}

async fn secret_data(client: &kube::Client) -> Option<std::collections::BTreeMap<String, Vec<u8>>> {
    let secret = Api::<Secret>::default_namespaced(client.clone())
        .get_opt(SECRET)
        .await
        .unwrap()?;
    Some(secret.data?.into_iter().map(|(k, v)| (k, v.0)).collect())
}

/// Whether `leaf` (PEM) verifies for `name` against the CAs of `bundle` (PEM), now.
fn verifies(bundle: &[u8], leaf: &[u8], name: &str) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(bundle) {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .unwrap();
    let leaf = CertificateDer::from_pem_slice(leaf).unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        .is_ok()
}

/// Polls `check` every 100 ms for up to `secs`; panics with `what` if it never holds.
async fn eventually<T>(secs: u64, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(t) = check().await {
            return t;
        }
        assert!(Instant::now() < deadline, "not within {secs} s: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn two_replicas_keep_one_secret_and_the_ca_bundles_through_renewals() {
    let Some(c) = cluster().await else { return };
    let config = format!("{}-hooks", c.ns);
    let mutating: MutatingWebhookConfiguration =
        serde_json::from_value(webhook(&c.ns, "mutating", &config)).unwrap();
    let validating: ValidatingWebhookConfiguration =
        serde_json::from_value(webhook(&c.ns, "validating", &config)).unwrap();
    Api::all(c.client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .unwrap();
    Api::all(c.client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .unwrap();
    let dns = format!("hooks.{}.svc", c.ns);
    let settings = CertSettings {
        namespace: c.ns.clone(),
        secret: SECRET.into(),
        configurations: vec![config.clone(), "not-installed".into()],
        certs: ipkeep_certs::Settings {
            dns_names: vec![dns.clone()],
            ca_validity: Duration::from_secs(15),
            cert_validity: Duration::from_secs(6),
        },
    };
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            let health = Arc::new(Health::default());
            tokio::spawn(keep(c.client.clone(), settings.clone(), health))
        })
        .collect();

    // Both configurations carry the CA that signed the serving certificate.
    let first = eventually(15, "the Secret and both caBundles", async || {
        let data = secret_data(&c.client).await?;
        let ca = data.get("ca.crt")?.clone();
        (bundles(&c.client, &config).await == vec![Some(ca.clone()); 2]).then_some(data)
    })
    .await;
    assert!(verifies(&first["ca.crt"], &first["tls.crt"], &dns));
    assert!(!verifies(&first["ca.crt"], &first["tls.crt"], "other.svc"));

    // The CA is renewed (8 s in): the new CA first, the old one still trusted, so the serving
    // certificate a pod may still have mounted verifies against the bundle the API server has.
    let mut before = first.clone();
    let rotated = eventually(20, "a new CA", async || {
        let data = secret_data(&c.client).await?;
        if CertificateDer::pem_slice_iter(&data["ca.crt"]).count() == 2 {
            return Some(data);
        }
        before = data;
        None
    })
    .await;
    let ca_bundle = rotated["ca.crt"].clone();
    assert!(verifies(&ca_bundle, &rotated["tls.crt"], &dns));
    assert!(
        verifies(&ca_bundle, &before["tls.crt"], &dns),
        "the serving certificate of the old CA (issued at most 4 s before, valid for 6) is trusted by the new bundle"
    );
    eventually(5, "both caBundles follow the new CA", async || {
        let now = secret_data(&c.client).await?;
        (bundles(&c.client, &config).await == vec![Some(now["ca.crt"].clone()); 2]).then_some(())
    })
    .await;

    // A caBundle reset by someone (a re-apply of manifests) is put back at the next look.
    let patch =
        json!({"webhooks": [{"name": "mutating.ipkeep.dev", "clientConfig": {"caBundle": null}}]});
    Api::<MutatingWebhookConfiguration>::all(c.client.clone())
        .patch(&config, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    eventually(10, "the reset caBundle put back", async || {
        let now = secret_data(&c.client).await?;
        (bundles(&c.client, &config).await == vec![Some(now["ca.crt"].clone()); 2]).then_some(())
    })
    .await;

    // Two replicas agree: writes follow renewals (one every few seconds), never a flurry of
    // competing ones.
    let secrets = Api::<Secret>::default_namespaced(c.client.clone());
    let mut versions = std::collections::BTreeSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let s = secrets.get(SECRET).await.unwrap();
        versions.insert(s.metadata.resource_version.unwrap());
        let data: std::collections::BTreeMap<String, Vec<u8>> =
            s.data.unwrap().into_iter().map(|(k, v)| (k, v.0)).collect();
        assert!(
            verifies(&data["ca.crt"], &data["tls.crt"], &dns),
            "the Secret always holds a certificate its bundle verifies"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        versions.len() <= 8,
        "{} versions of the Secret in 10 s: the replicas compete",
        versions.len()
    );
    for r in replicas {
        r.abort();
    }
}

/// ipkeep-controller's service account in deploy/.
const CONTROLLER: &str = "system:serviceaccount:ipkeep-system:ipkeep-controller";
/// The webhook server's Secret and the webhook configurations' name in deploy/.
const DEPLOY_SECRET: &str = "ipkeep-scheduler-ext-tls";
const DEPLOY_CONFIGURATIONS: &str = "ipkeep-scheduler-ext";

fn deploy_file(path: &str) -> String {
    let path = ipkeep_tests::cluster::repo_root().join("deploy").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The documents of the multi-document `yaml` whose `metadata.name` starts with `prefix`.
fn named(yaml: &str, prefix: &str) -> String {
    let needle = format!("\n  name: {prefix}");
    yaml.split("\n---\n")
        .filter(|doc| doc.contains(&needle))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A client as ipkeep-controller's service account of deploy/, with only its own rights (no
/// `system:masters`).
async fn as_controller(c: &Cluster) -> kube::Client {
    let mut config = c.server.config("ipkeep-system").await;
    config.auth_info.impersonate = Some(CONTROLLER.into());
    config.auth_info.impersonate_groups = Some(
        [
            "system:serviceaccounts",
            "system:serviceaccounts:ipkeep-system",
            "system:authenticated",
        ]
        .map(String::from)
        .to_vec(),
    );
    kube::Client::try_from(config).unwrap()
}

fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("{what}: not refused: {other:?}"),
    }
}

/// Security review L-3: with the rights deploy/ gives it (controller/rbac.yaml and the admission
/// policies ipkeep-controller-secrets and ipkeep-controller-ca-bundles), ipkeep-controller
/// creates, fills and refills the webhook server's Secret when it is missing or emptied, and
/// sets the webhook configurations' caBundle; its token creates no other Secret and changes
/// nothing else of the webhook configurations.
#[tokio::test]
async fn with_the_shipped_rights_the_controller_writes_its_secret_and_the_ca_bundles_only() {
    let Some(c) = cluster().await else { return };
    let kubectl = c.server.kubectl();
    if kubectl
        .try_run(&["get", "namespace", "ipkeep-system"], None)
        .status
        .success()
    {
        kubectl.run(&["delete", "secret", "-n", "ipkeep-system", "--all"]);
    } else {
        kubectl.run(&["create", "namespace", "ipkeep-system"]);
    }
    kubectl.apply(&deploy_file("controller/rbac.yaml"));
    let policies = named(
        &deploy_file("controller/admission-policies.yaml"),
        "ipkeep-controller-",
    );
    if !policies.is_empty() {
        kubectl.apply(&policies);
    }
    kubectl.apply(&deploy_file("scheduler-ext/webhook.yaml"));
    kubectl.apply(&deploy_file("scheduler-ext/lifecycle-webhook.yaml"));
    let controller = as_controller(&c).await;
    let secrets = Api::<Secret>::namespaced(controller.clone(), "ipkeep-system");
    let secret = |name: &str, type_: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": name}, "type": type_,
            "data": {"tls.crt": "", "tls.key": ""}}))
        .unwrap()
    };

    // Any other Secret is refused, once the policies are active (their informers start
    // asynchronously).
    let deadline = Instant::now() + Duration::from_secs(60);
    let message = loop {
        match secrets
            .create(
                &PostParams::default(),
                &secret("not-mine", "kubernetes.io/tls"),
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 => break s.message,
            Ok(_) => {
                Api::<Secret>::namespaced(c.client.clone(), "ipkeep-system")
                    .delete("not-mine", &Default::default())
                    .await
                    .unwrap();
            }
            Err(e) => panic!("create not-mine: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "60 s after deploy/'s policies were applied, ipkeep-controller's token still creates any Secret in ipkeep-system"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        message.contains("ipkeep-controller writes no Secret but"),
        "{message}"
    );
    let token = json!({"metadata": {"name": DEPLOY_SECRET, "annotations":
        {"kubernetes.io/service-account.name": "ipkeep-scheduler-ext"}},
        "type": "kubernetes.io/service-account-token"});
    refused(
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(token).unwrap(),
            )
            .await,
        "a service-account token Secret under the certificate Secret's name",
    );
    refused(
        Api::<Secret>::namespaced(controller.clone(), &c.ns)
            .create(
                &PostParams::default(),
                &secret(DEPLOY_SECRET, "kubernetes.io/tls"),
            )
            .await,
        "the certificate Secret in another namespace",
    );

    // Missing: created; its CA in both configurations.
    let settings = CertSettings {
        namespace: "ipkeep-system".into(),
        secret: DEPLOY_SECRET.into(),
        configurations: vec![DEPLOY_CONFIGURATIONS.into()],
        certs: ipkeep_certs::Settings {
            dns_names: vec!["ipkeep-scheduler-ext.ipkeep-system.svc".into()],
            // Short, so that the keeper looks every few seconds.
            ca_validity: Duration::from_secs(15),
            cert_validity: Duration::from_secs(6),
        },
    };
    let keeper = tokio::spawn(keep(
        controller.clone(),
        settings,
        Arc::new(Health::default()),
    ));
    let admin_secrets = Api::<Secret>::namespaced(c.client.clone(), "ipkeep-system");
    let filled = async |what: &str, not: Option<&[u8]>| -> Vec<u8> {
        eventually(20, what, async || {
            let s = admin_secrets.get_opt(DEPLOY_SECRET).await.unwrap()?;
            let ca = s.data?.get("ca.crt")?.0.clone();
            let fresh = !ca.is_empty() && not != Some(&ca[..]);
            (fresh && bundles(&c.client, DEPLOY_CONFIGURATIONS).await == vec![Some(ca.clone()); 4])
                .then_some(ca)
        })
        .await
    };
    let first = filled(
        "the missing Secret created and both configurations' caBundle set",
        None,
    )
    .await;

    // Emptied (as re-applying an empty Secret would): filled again, with a new CA.
    let mut emptied = admin_secrets.get(DEPLOY_SECRET).await.unwrap();
    emptied.data = secret(DEPLOY_SECRET, "kubernetes.io/tls").data;
    admin_secrets
        .replace(DEPLOY_SECRET, &PostParams::default(), &emptied)
        .await
        .unwrap();
    let second = filled("the emptied Secret filled again", Some(&first)).await;

    // Deleted: created again.
    admin_secrets
        .delete(DEPLOY_SECRET, &Default::default())
        .await
        .unwrap();
    filled("the deleted Secret created again", Some(&second)).await;

    // The webhook configurations: nothing but caBundle.
    let mutating = Api::<MutatingWebhookConfiguration>::all(controller.clone());
    let validating = Api::<ValidatingWebhookConfiguration>::all(controller.clone());
    let strategic = |hook: &str, change: serde_json::Value| {
        let mut w = json!({"name": hook});
        if let (Some(w), Some(change)) = (w.as_object_mut(), change.as_object()) {
            w.extend(change.clone());
        }
        json!({"webhooks": [w]})
    };
    let elsewhere = json!({"clientConfig": {"service": {"namespace": "attacker", "name": "steal", "path": "/all"}}});
    for (what, result) in [
        (
            "the pinning webhook's Service",
            mutating
                .patch(
                    DEPLOY_CONFIGURATIONS,
                    &PatchParams::default(),
                    &Patch::Strategic(strategic("pin.ipkeep.dev", elsewhere.clone())),
                )
                .await
                .map(|_| ()),
        ),
        (
            "the lifecycle webhook's rules",
            validating
                .patch(
                    DEPLOY_CONFIGURATIONS,
                    &PatchParams::default(),
                    &Patch::Strategic(strategic(
                        "evict.lifecycle.ipkeep.dev",
                        json!({"rules": [{"operations": ["*"], "apiGroups": ["*"],
                            "apiVersions": ["*"], "resources": ["*/*"]}]}),
                    )),
                )
                .await
                .map(|_| ()),
        ),
        (
            "the lifecycle configuration's labels",
            validating
                .patch(
                    DEPLOY_CONFIGURATIONS,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
                )
                .await
                .map(|_| ()),
        ),
        (
            "the pinning webhook's failurePolicy",
            mutating
                .patch(
                    DEPLOY_CONFIGURATIONS,
                    &PatchParams::default(),
                    &Patch::Strategic(strategic(
                        "pin.ipkeep.dev",
                        json!({"failurePolicy": "Fail"}),
                    )),
                )
                .await
                .map(|_| ()),
        ),
    ] {
        let message = refused(result, what);
        assert!(
            message.contains("nothing of a webhook configuration but its webhooks' caBundle"),
            "{what}: {message}"
        );
    }
    // Its own job still goes through: a reset caBundle is put back.
    let reset = strategic(
        "pin.ipkeep.dev",
        json!({"clientConfig": {"caBundle": null}}),
    );
    Api::<MutatingWebhookConfiguration>::all(c.client.clone())
        .patch(
            DEPLOY_CONFIGURATIONS,
            &PatchParams::default(),
            &Patch::Strategic(&reset),
        )
        .await
        .unwrap();
    eventually(
        20,
        "the reset caBundle put back by the controller",
        async || {
            let s = admin_secrets.get_opt(DEPLOY_SECRET).await.unwrap()?;
            let ca = s.data?.get("ca.crt")?.0.clone();
            (bundles(&c.client, DEPLOY_CONFIGURATIONS).await == vec![Some(ca); 4]).then_some(())
        },
    )
    .await;
    keeper.abort();
    if !policies.is_empty() {
        kubectl.run(&[
            "delete",
            "validatingadmissionpolicies,validatingadmissionpolicybindings",
            "ipkeep-controller-secrets",
            "ipkeep-controller-ca-bundles",
        ]);
    }
}
