//! A certificate authority made in the test (rcgen, ring): a CA and certificates it signs for
//! 127.0.0.1 and localhost, for the TLS and mutual TLS tests of the node and the CLI.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority of the tests.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("generate a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-sign the CA");
        Ca { issuer }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for 127.0.0.1 and localhost (server and client use): (cert, key) PEM.
    pub fn leaf(&self, name: &str, serial: u64) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("names of a certificate");
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(serial.into());
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("generate a key");
        let cert = params
            .signed_by(&key, &*self.issuer)
            .expect("sign a certificate");
        (cert.pem(), key.serialize_pem())
    }
}
