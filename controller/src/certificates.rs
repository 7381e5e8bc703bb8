//! `--webhook-certificates`: keeps the webhook server's CA and serving certificate in the Secret
//! it mounts, and the CA in the `caBundle` of the webhook configurations, from the pure
//! decisions of `ipkeep_certs` (renewal when a third of a lifetime is left, the old CA trusted
//! beside the new one until it expires).
//!
//! It runs in every replica, leader or not: each write of the Secret carries the
//! resourceVersion it read, so replicas that decide at once agree (one write wins; the others
//! read it and find nothing to do), and the certificates stay current while no replica leads.
//! The controller, not the webhook server, holds these write permissions: the server that
//! answers unauthenticated connections can write no Secret and no webhook configuration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipkeep_certs::{Plan, SecretData};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::FIELD_MANAGER;
use crate::http::Health;

/// How often the Secret and the webhook configurations are checked at least (a `caBundle`
/// reset by a re-apply of the manifests is put back within this).
const CHECK_EVERY: Duration = Duration::from_secs(60);
/// The pause after a failed attempt.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// What to keep.
#[derive(Debug, Clone)]
pub struct CertSettings {
    /// The namespace of the Secret (and of the webhook Service).
    pub namespace: String,
    /// The Secret the webhook server mounts (`kubernetes.io/tls`, plus `ca.crt` and `ca.key`).
    pub secret: String,
    /// The Mutating- and ValidatingWebhookConfigurations whose webhooks get the `caBundle`
    /// (a name of either kind; one that does not exist is skipped with a warning).
    pub configurations: Vec<String>,
    /// Names and lifetimes.
    pub certs: ipkeep_certs::Settings,
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
enum CertError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Generate(#[from] ipkeep_certs::Error),
}

/// Keeps the certificates current, until the task is dropped.
pub async fn keep(client: Client, settings: CertSettings, health: Arc<Health>) {
    let mut missing_reported = Vec::new();
    loop {
        let wait = match once(&client, &settings, &mut missing_reported).await {
            Ok(plan) => {
                let expiry = |t: SystemTime| {
                    (t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs())
                        .try_into()
                        .unwrap_or(i64::MAX)
                };
                health
                    .metrics
                    .webhook_certificate_expiry
                    .set(expiry(plan.cert_expiry));
                health.metrics.webhook_ca_expiry.set(expiry(plan.ca_expiry));
                let due = plan.renew_at.duration_since(SystemTime::now());
                due.unwrap_or_default().min(CHECK_EVERY)
            }
            Err(CertError::Api(kube::Error::Api(e))) if e.code == 409 => {
                info!(secret = %settings.secret, "another replica wrote the webhook certificates first; reading theirs");
                Duration::ZERO
            }
            Err(e) => {
                warn!(secret = %settings.secret, error = %e, retry_in = ?RETRY_AFTER, "failed to keep the webhook certificates");
                RETRY_AFTER
            }
        };
        tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
    }
}

/// One look: the Secret planned and written if it must change, then the `caBundle` of every
/// webhook configuration.
async fn once(
    client: &Client,
    s: &CertSettings,
    missing_reported: &mut Vec<String>,
) -> Result<Plan, CertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &s.namespace);
    let held = secrets.get_opt(&s.secret).await?;
    let data: SecretData = (held.as_ref().and_then(|h| h.data.as_ref()))
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    let plan = ipkeep_certs::plan(&data, &s.certs, SystemTime::now())?;
    if let Some(change) = &plan.change {
        let written: BTreeMap<String, ByteString> = (plan.data.iter())
            .map(|(k, v)| (k.clone(), ByteString(v.clone())))
            .collect();
        let post = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match held {
            // The resourceVersion read comes back with it: a concurrent write fails with 409.
            Some(mut secret) => {
                secret.data = Some(written);
                secrets.replace(&s.secret, &post, &secret).await?;
            }
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(s.secret.clone()),
                        labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/managed-by".to_string(),
                            FIELD_MANAGER.to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(written),
                    ..Secret::default()
                };
                secrets.create(&post, &secret).await?;
            }
        }
        info!(
            secret = %s.secret,
            namespace = %s.namespace,
            %change,
            certificate_expires = %humantime::format_rfc3339_seconds(plan.cert_expiry),
            ca_expires = %humantime::format_rfc3339_seconds(plan.ca_expiry),
            "wrote the webhook certificates"
        );
    }
    for name in &s.configurations {
        let mutating = set_bundle(client, name, &plan, |c: &MutatingWebhookConfiguration| {
            let webhooks = c.webhooks.iter().flatten();
            webhooks
                .map(|w| (w.name.clone(), w.client_config.ca_bundle.clone()))
                .collect()
        });
        let validating = set_bundle(client, name, &plan, |c: &ValidatingWebhookConfiguration| {
            let webhooks = c.webhooks.iter().flatten();
            webhooks
                .map(|w| (w.name.clone(), w.client_config.ca_bundle.clone()))
                .collect()
        });
        let found = mutating.await? | validating.await?;
        if !found && !missing_reported.contains(name) {
            warn!(configuration = %name, hint = "its caBundle is set once it exists", "no webhook configuration of this name");
            missing_reported.push(name.clone());
        }
    }
    Ok(plan)
}

/// Sets the `caBundle` of every webhook of configuration `name` of kind `K` that does not carry
/// the plan's; `false` if there is no such configuration.
async fn set_bundle<K>(
    client: &Client,
    name: &str,
    plan: &Plan,
    bundles: impl Fn(&K) -> Vec<(String, Option<ByteString>)>,
) -> Result<bool, kube::Error>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + serde::Serialize,
{
    let api: Api<K> = Api::all(client.clone());
    let Some(config) = api.get_opt(name).await? else {
        return Ok(false);
    };
    let stale: Vec<String> = bundles(&config)
        .into_iter()
        .filter(|(_, bundle)| bundle.as_ref().map(|b| &b.0) != Some(&plan.ca_bundle))
        .map(|(webhook, _)| webhook)
        .collect();
    if stale.is_empty() {
        return Ok(true);
    }
    // Strategic merge: webhooks are merged by name, only their caBundle changes.
    let webhooks: Vec<serde_json::Value> = (stale.iter())
        .map(|w| serde_json::json!({"name": w, "clientConfig": {"caBundle": ByteString(plan.ca_bundle.clone())}}))
        .collect();
    let patch = serde_json::json!({ "webhooks": webhooks });
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    info!(kind = <K as k8s_openapi::Resource>::KIND, configuration = %name, webhooks = ?stale, "set the webhooks' caBundle to the CA in use");
    Ok(true)
}
