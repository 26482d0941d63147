//! Certificates for a test control plane: one CA that signs the apiserver's serving
//! certificate and any webhook server's (so a webhook's `caBundle` is just [`Pki::ca_pem`]),
//! and the service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::Error;

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The control plane's certificate authority.
#[derive(Debug)]
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new() -> Result<Pki, Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "podprobe test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Pki { ca })
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    pub fn ca_der(&self) -> Vec<u8> {
        self.ca.der().to_vec()
    }

    /// A serving certificate for `names` (DNS names or IP addresses), signed by the CA.
    pub fn issue(&self, names: &[&str]) -> Result<CertPair, Error> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl Pki {
    /// A client certificate for user `common_name` in group `organization`, signed by the CA
    /// (the apiserver's `--client-ca-file` and a kubelet's `clientCAFile`).
    pub fn issue_client(&self, common_name: &str, organization: &str) -> Result<CertPair, Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A fresh ECDSA P-256 key pair as PEM (private PKCS#8, public SPKI): kube-apiserver's
/// service-account signing key (ES256 tokens) and verification key.
pub fn signing_key_pem() -> Result<(String, String), Error> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}
