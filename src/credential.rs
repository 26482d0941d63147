//! The sidecar's own token on a virtual node, renewed before it expires.
//!
//! There the token comes from a Secret podprobe-manager filled once, which the provider copied
//! once, when it started the pod: nothing refreshes it, as the kubelet refreshes a projected
//! token at 80 % of its lifetime. Its lifetime is what the manager asked (a year by default)
//! or less where the apiserver caps it (`--service-account-max-token-expiration`; 90 days on
//! some clusters), so a game server that outlives it would lose its conditions. So the sidecar
//! renews it itself, as the kubelet would: at 80 % of its lifetime or a day after it was issued,
//! whichever comes first, up to 10 s earlier at random, it asks the apiserver for a new token
//! of its own service account, bound to its own pod, with the same lifetime (a TokenRequest,
//! which the chart's admission policy confines to the requester's own pod), and writes it into
//! a directory of the pod (an `emptyDir`), where its client reads it (kube-rs reads a token
//! file again every minute). The directory outlives a restart of the container, so a restarted
//! sidecar takes the newest token it holds, the renewed one or the Secret's. None of it needs
//! podprobe-manager.

use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::BackoffBuilder;
use base64::Engine;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The file in the renewal directory that holds the token in use.
pub const TOKEN_FILE: &str = "token";
/// The share of a token's lifetime after which it is renewed (the kubelet's).
const RENEW_AT: f64 = 0.8;
/// The age at which a token is renewed whatever its lifetime (the kubelet's `maxTTL`): a
/// year-long token is replaced daily, as a projected one would be.
const MAX_AGE: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);
/// A renewal comes due up to this much early, drawn anew for each token (the kubelet's
/// `maxJitter`): sidecars whose tokens were issued in the same second renew apart.
pub const MAX_JITTER: Duration = Duration::from_secs(10);
/// The longest a wait for a renewal trusts its timer before it reads the wall clock again. The
/// token's times are the wall clock's, and a timer does not count the time a machine spent
/// suspended: a single long sleep could wake after the token expired.
const RECHECK: Duration = Duration::from_secs(60);
/// The longest wait between two attempts at a renewal the apiserver refused.
const MAX_RETRY: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read the token {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the renewed token to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the client has no token to renew (neither a token nor a token file is configured)")]
    NoToken,
    #[error(
        "the token is not a pod-bound service-account token (a JWT with exp, iat and kubernetes.io pod and serviceaccount claims): {0}"
    )]
    Claims(String),
    #[error("the apiserver refused a new token: {0}")]
    Request(#[from] kube::Error),
}

/// What the renewal reads of a token: when it expires and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub issued: Timestamp,
    pub expires: Timestamp,
    pub namespace: String,
    pub service_account: String,
    pub pod_name: String,
    pub pod_uid: String,
}

impl Claims {
    /// The claims of `token` (its signature is the apiserver's to check, not ours).
    pub fn of(token: &str) -> Result<Claims, CredentialError> {
        #[derive(Deserialize)]
        struct Named {
            name: String,
            #[serde(default)]
            uid: String,
        }
        #[derive(Deserialize)]
        struct Kubernetes {
            namespace: String,
            pod: Option<Named>,
            serviceaccount: Named,
        }
        #[derive(Deserialize)]
        struct Jwt {
            iat: i64,
            exp: i64,
            #[serde(rename = "kubernetes.io")]
            kubernetes: Kubernetes,
        }
        let bad = |why: &str| CredentialError::Claims(why.to_owned());
        let payload = token
            .trim()
            .split('.')
            .nth(1)
            .ok_or_else(|| bad("no payload"))?;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .map_err(|e| bad(&e.to_string()))?;
        let jwt: Jwt = serde_json::from_slice(&json).map_err(|e| bad(&e.to_string()))?;
        let pod = jwt.kubernetes.pod.ok_or_else(|| bad("bound to no pod"))?;
        let at = |s: i64| Timestamp::from_second(s).map_err(|e| bad(&e.to_string()));
        Ok(Claims {
            issued: at(jwt.iat)?,
            expires: at(jwt.exp)?,
            namespace: jwt.kubernetes.namespace,
            service_account: jwt.kubernetes.serviceaccount.name,
            pod_name: pod.name,
            pod_uid: pod.uid,
        })
    }

    /// When this token is due for renewal before any jitter: at [`RENEW_AT`] of its lifetime
    /// or [`MAX_AGE`] after it was issued, whichever comes first (the kubelet's rule).
    pub fn renew_at(&self) -> Timestamp {
        let lifetime = self.expires.duration_since(self.issued);
        (self.issued + lifetime.mul_f64(RENEW_AT)).min(self.issued + MAX_AGE)
    }

    /// [`Claims::renew_at`], `jitter` earlier.
    fn renew_at_jittered(&self, jitter: Duration) -> Timestamp {
        self.renew_at() - jitter
    }

    fn lifetime_seconds(&self) -> i64 {
        self.expires.duration_since(self.issued).as_secs()
    }
}

/// The token the sidecar uses and renews, in its renewal directory.
#[derive(Debug, Clone)]
pub struct Renewal {
    file: PathBuf,
    claims: Claims,
}

impl Renewal {
    pub fn claims(&self) -> &Claims {
        &self.claims
    }
}

/// Points `config` at the token in `dir` and returns what to renew: the token `config` came
/// with (the issued Secret's) or the one a previous run of this container renewed into `dir`,
/// whichever expires later.
pub fn prepare(config: &mut kube::Config, dir: &Path) -> Result<Renewal, CredentialError> {
    let given = match (&config.auth_info.token_file, &config.auth_info.token) {
        (Some(path), _) => read(Path::new(path))?,
        (None, Some(token)) => secrecy::ExposeSecret::expose_secret(token).to_owned(),
        (None, None) => return Err(CredentialError::NoToken),
    };
    let file = dir.join(TOKEN_FILE);
    let given_claims = Claims::of(&given)?;
    let kept = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| Claims::of(&t).ok().map(|c| (t, c)))
        .filter(|(_, c)| c.pod_uid == given_claims.pod_uid && c.expires > given_claims.expires);
    let claims = match kept {
        Some((_, claims)) => claims,
        None => {
            write(&file, &given)?;
            given_claims
        }
    };
    config.auth_info.token = None;
    config.auth_info.token_file = Some(file.to_string_lossy().into_owned());
    Ok(Renewal { file, claims })
}

fn read(path: &Path) -> Result<String, CredentialError> {
    std::fs::read_to_string(path).map_err(|source| CredentialError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Writes `token` to `file` whole: a reader sees the old token or the new one.
fn write(file: &Path, token: &str) -> Result<(), CredentialError> {
    let failed = |source| CredentialError::Write {
        path: file.to_owned(),
        source,
    };
    let partial = file.with_extension("partial");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .map_err(failed)?;
        out.write_all(token.as_bytes()).map_err(failed)?;
    }
    std::fs::rename(&partial, file).map_err(failed)
}

/// Renews `renewal`'s token with `client` before each expiry until `shutdown`, retrying a
/// refusal with backoff (1 s doubling to 5 min) and saying so. `metrics` show the token held
/// and when it is due, so a renewal the apiserver keeps refusing alerts before the token
/// expires.
pub async fn renew(
    client: Client,
    mut renewal: Renewal,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    loop {
        let due = renewal.claims.renew_at_jittered(jitter());
        metrics.token(&renewal.claims.service_account, renewal.claims.expires, due);
        tracing::info!(
            expires = %renewal.claims.expires,
            "the sidecar's token, bound to the pod, expires at {}; renewing it at {due}",
            renewal.claims.expires
        );
        // Past due (a restart late in the token's life): at once.
        while let Some(wait) = wait_before(Timestamp::now(), due) {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
        let mut retries = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(MAX_RETRY)
            .with_jitter()
            .without_max_times()
            .build();
        renewal = loop {
            match renew_once(&client, &renewal).await {
                Ok(renewed) => break renewed,
                Err(e) => {
                    let wait = retries.next().unwrap_or(MAX_RETRY);
                    let left = Timestamp::now().duration_until(renewal.claims.expires);
                    tracing::warn!(
                        "cannot renew the sidecar's token ({e}); it expires in {left:#}; retrying in {wait:?}"
                    );
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        };
    }
}

/// A random share of [`MAX_JITTER`].
fn jitter() -> Duration {
    MAX_JITTER.mul_f64(rand::random::<f64>())
}

/// How long to sleep at `now` before looking again whether `due` has come: `None` once it has,
/// and never longer than [`RECHECK`].
fn wait_before(now: Timestamp, due: Timestamp) -> Option<Duration> {
    Duration::try_from(now.duration_until(due))
        .ok()
        .filter(|left| !left.is_zero())
        .map(|left| left.min(RECHECK))
}

async fn renew_once(client: &Client, renewal: &Renewal) -> Result<Renewal, CredentialError> {
    let claims = &renewal.claims;
    let request = podprobe_ops::token::bound_to_pod(
        &claims.pod_name,
        &claims.pod_uid,
        claims.lifetime_seconds(),
    );
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), &claims.namespace)
        .create_token_request(&claims.service_account, &PostParams::default(), &request)
        .await?;
    let token = issued.status.map(|s| s.token).unwrap_or_default();
    let renewed = Claims::of(&token)?;
    write(&renewal.file, &token)?;
    tracing::info!(
        "renewed the sidecar's token: bound to the pod, valid until {}",
        renewed.expires
    );
    Ok(Renewal {
        file: renewal.file.clone(),
        claims: renewed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unsigned token with the claims the apiserver gives a pod-bound one.
    pub fn token(iat: i64, exp: i64, uid: &str) -> String {
        let claims = serde_json::json!({
            "aud": ["https://kubernetes.default.svc"], "iat": iat, "exp": exp, "nbf": iat,
            "sub": "system:serviceaccount:games:podprobe-sidecar",
            "kubernetes.io": {"namespace": "games",
                "pod": {"name": "gs-0", "uid": uid},
                "serviceaccount": {"name": "podprobe-sidecar", "uid": "sa-1"}}
        });
        let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.{}",
            enc(br#"{"alg":"RS256"}"#),
            enc(claims.to_string().as_bytes()),
            enc(b"sig")
        )
    }

    #[test]
    fn claims_and_the_renewal_time_come_from_the_token() {
        let claims = Claims::of(&token(1_000, 11_000, "u-1")).unwrap();
        assert_eq!(claims.pod_name, "gs-0");
        assert_eq!(claims.pod_uid, "u-1");
        assert_eq!(claims.service_account, "podprobe-sidecar");
        assert_eq!(claims.namespace, "games");
        assert_eq!(claims.renew_at(), Timestamp::from_second(9_000).unwrap());
        assert_eq!(claims.lifetime_seconds(), 10_000);
        assert!(matches!(
            Claims::of("not-a-jwt"),
            Err(CredentialError::Claims(_))
        ));
    }

    #[test]
    fn a_token_is_renewed_a_day_after_it_was_issued_whatever_its_lifetime() {
        const DAY: i64 = 24 * 3600;
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        // An hour: at 80 % of it. Two days: at one day, not at 80 % (38.4 hours).
        let hour = Claims::of(&token(1_000, 1_000 + 3_600, "u-1")).unwrap();
        assert_eq!(hour.renew_at(), at(1_000 + 2_880));
        let two_days = Claims::of(&token(1_000, 1_000 + 2 * DAY, "u-1")).unwrap();
        assert_eq!(two_days.renew_at(), at(1_000 + DAY));
        // Jitter only ever brings it forward, by at most MAX_JITTER.
        assert_eq!(
            two_days.renew_at_jittered(Duration::from_secs(4)),
            at(1_000 + DAY - 4)
        );
        let draws: Vec<Duration> = (0..1_000).map(|_| jitter()).collect();
        assert!(draws.iter().all(|d| *d <= MAX_JITTER), "{draws:?}");
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 900, "{} distinct draws", distinct.len());
    }

    #[test]
    fn a_wait_for_a_renewal_reads_the_clock_again_at_least_every_minute() {
        let due = Timestamp::from_second(100_000).unwrap();
        let before = |s: i64| wait_before(due - jiff::SignedDuration::from_secs(s), due);
        assert_eq!(before(30 * 24 * 3600), Some(RECHECK));
        assert_eq!(before(61), Some(RECHECK));
        assert_eq!(before(5), Some(Duration::from_secs(5)));
        assert_eq!(before(0), None);
        assert_eq!(before(-5), None, "past due: at once");
    }

    #[test]
    fn a_restarted_sidecar_takes_the_token_that_lasts_longer() {
        let dir = tempfile::tempdir().unwrap();
        let mounted = dir.path().join("mounted");
        std::fs::write(&mounted, token(1_000, 11_000, "u-1")).unwrap();
        let renewed_dir = dir.path().join("renewed");
        std::fs::create_dir(&renewed_dir).unwrap();
        let config = || {
            let mut c = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
            c.auth_info.token_file = Some(mounted.to_string_lossy().into_owned());
            c
        };

        // First start: the mounted token, copied where the client reads it.
        let mut first = config();
        let renewal = prepare(&mut first, &renewed_dir).unwrap();
        let file = renewed_dir.join(TOKEN_FILE);
        assert_eq!(
            first.auth_info.token_file.as_deref(),
            Some(file.to_str().unwrap())
        );
        assert_eq!(renewal.claims().expires.as_second(), 11_000);

        // Renewed, then restarted: the renewed token is kept.
        std::fs::write(&file, token(9_000, 19_000, "u-1")).unwrap();
        let renewal = prepare(&mut config(), &renewed_dir).unwrap();
        assert_eq!(renewal.claims().expires.as_second(), 19_000);

        // A token of another pod (a same-named directory reused) is not.
        std::fs::write(&file, token(9_000, 29_000, "u-2")).unwrap();
        let renewal = prepare(&mut config(), &renewed_dir).unwrap();
        assert_eq!(renewal.claims().expires.as_second(), 11_000);
        assert_eq!(
            Claims::of(&std::fs::read_to_string(&file).unwrap())
                .unwrap()
                .pod_uid,
            "u-1"
        );
    }
}
