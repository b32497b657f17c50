//! The one TLS provider of every HTTPS client cairn builds (reqwest's for
//! registries, kube's for clusters): rustls with ring. Only ring is built
//! in, so there is never a second provider for a client to trip over.

/// Makes ring the process's TLS provider, once; call it before building an
/// HTTPS client (reqwest refuses to build one without a provider).
pub fn install_provider() {
    // Err means a provider is already installed: ring, the only one built.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    use super::*;

    /// A real handshake: an HTTPS server on loopback (Python's `ssl` with a
    /// certificate made by `openssl`) answered through reqwest.
    #[test]
    fn an_https_request_completes_with_the_installed_provider() {
        let dir = tempfile::tempdir().unwrap();
        // A CA, and a certificate for localhost that it signed.
        let made = Command::new("sh")
            .arg("-c")
            .arg(
                "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=cairn-test-ca \
                   -keyout ca.key -out ca.pem && \
                 openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
                   -keyout key.pem -out leaf.csr && \
                 echo subjectAltName=DNS:localhost > leaf.ext && \
                 openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
                   -days 1 -extfile leaf.ext -out cert.pem",
            )
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(made.success());
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(dir.path().join("hello.txt"), "hello over tls\n").unwrap();
        let server = r#"
import http.server, ssl, sys
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"#;
        let mut child = Command::new("python3")
            .args(["-c", server])
            .arg(&cert)
            .arg(&key)
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut port = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();

        install_provider();
        let root =
            reqwest::Certificate::from_pem(&std::fs::read(dir.path().join("ca.pem")).unwrap())
                .expect("a PEM");
        let client = reqwest::blocking::Client::builder()
            .add_root_certificate(root)
            .build()
            .expect("a client builds with the provider");
        let answer = client
            .get(format!("https://localhost:{}/hello.txt", port.trim()))
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.text());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            answer.expect("the handshake and request succeed"),
            "hello over tls\n"
        );
    }
}
