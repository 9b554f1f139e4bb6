//! Sessions on both ends of a socket pair, driven in one thread: the handshake's checks, and
//! data through in both directions in pieces larger and smaller than a record.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use nyala_tls::{Progress, Received, Session, TlsConfig, TlsError};

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn server_config() -> TlsConfig {
    TlsConfig::server(&data("ca.pem"), &data("server.pem"), &data("server.key")).unwrap()
}

fn client_config(cert: &str) -> TlsConfig {
    TlsConfig::client(
        &data("ca.pem"),
        &data(&format!("{cert}.pem")),
        &data(&format!("{cert}.key")),
    )
    .unwrap()
}

struct Pair {
    server: Session,
    client: Session,
    sockets: (UnixStream, UnixStream),
}

fn pair(client: TlsConfig, server_name: &str) -> Pair {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let server = Session::new(&server_config(), a.as_raw_fd(), None).unwrap();
    let client = Session::new(&client, b.as_raw_fd(), Some(server_name)).unwrap();
    Pair {
        server,
        client,
        sockets: (a, b),
    }
}

/// Steps both handshakes until both are done or one fails; a side that fails closes its
/// socket, as the channel does.
fn shake(p: &mut Pair) -> (Result<(), TlsError>, Result<(), TlsError>) {
    fn step(session: &mut Session, socket: &UnixStream, done: &mut Option<Result<(), TlsError>>) {
        if done.is_some() {
            return;
        }
        match session.handshake() {
            Ok(Progress::Done) => *done = Some(Ok(())),
            Ok(_) => {}
            Err(e) => {
                *done = Some(Err(e));
                socket.shutdown(std::net::Shutdown::Both).unwrap();
            }
        }
    }
    let (mut server_done, mut client_done) = (None, None);
    for _ in 0..100 {
        step(&mut p.client, &p.sockets.1, &mut client_done);
        step(&mut p.server, &p.sockets.0, &mut server_done);
        if server_done.is_some() && client_done.is_some() {
            break;
        }
    }
    (
        server_done.expect("server handshake stuck"),
        client_done.expect("client handshake stuck"),
    )
}

/// Moves `message` from `from` to `to`, in `piece`-byte writes and reads into a buffer of
/// `buffer` bytes, flushing when the socket fills; returns what `to` received.
fn transfer(
    from: &mut Session,
    to: &mut Session,
    message: &[u8],
    piece: usize,
    buffer: usize,
) -> Vec<u8> {
    let mut got = Vec::new();
    let mut out = vec![0u8; buffer];
    let mut sent = 0;
    let mut unsent = 0;
    while got.len() < message.len() {
        if unsent > 0 {
            unsent = from.flush().unwrap();
        } else if sent < message.len() {
            let end = (sent + piece).min(message.len());
            unsent = from.send(&message[sent..end]).unwrap();
            sent = end;
        }
        loop {
            match to.recv_into(&mut out).unwrap() {
                Received::Data(n) => got.extend_from_slice(&out[..n]),
                Received::WouldBlock => break,
                Received::Eof => panic!("unexpected end after {} bytes", got.len()),
            }
        }
    }
    got
}

#[test]
fn data_goes_both_ways_in_pieces_of_every_size() {
    let mut p = connected();
    assert!(
        p.client.cipher().unwrap().contains("AES_128_GCM"),
        "{:?}",
        p.client.cipher()
    );
    let message: Vec<u8> = (0..6_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for (piece, buffer) in [
        (6_000_000, 256 * 1024), // one frame larger than the outgoing room kept
        (1_000_000, 256 * 1024),
        (100_000, 7),
        (16_385, 100_000),
        (1, 4096),
    ] {
        // Tiny pieces or a tiny buffer: a shorter message.
        let len = match (piece, buffer) {
            (1, _) => 5_000,
            (_, 7) => 300_000,
            _ => message.len(),
        };
        let message = &message[..len];
        assert_eq!(
            transfer(&mut p.client, &mut p.server, message, piece, buffer),
            message
        );
        assert_eq!(
            transfer(&mut p.server, &mut p.client, message, piece, buffer),
            message
        );
    }
    // Each side sees the other's certificate.
    assert_eq!(
        p.server.peer_certificate().unwrap(),
        pem_der(&data("client.pem"))
    );
    assert_eq!(
        p.client.peer_certificate().unwrap(),
        pem_der(&data("server.pem"))
    );
}

fn pem_der(pem: &[u8]) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem)
        .unwrap()
        .to_vec()
}

/// The error of the side (`server_side` or the client) that refuses the other's certificate.
fn refusal(client: &str, server_name: &str, server_side: bool) -> String {
    let mut p = pair(client_config(client), server_name);
    let (server, client) = shake(&mut p);
    let refused = if server_side { server } else { client };
    refused
        .expect_err("the certificate was accepted")
        .to_string()
}

#[test]
fn a_client_certificate_of_another_ca_is_refused() {
    let err = refusal("stranger", "srv.server.nyala", true);
    assert!(err.contains("UnknownIssuer"), "{err}");
}

#[test]
fn a_server_certificate_for_another_name_is_refused() {
    let err = refusal("client", "someone-else.server.nyala", false);
    assert!(err.contains("not valid for name"), "{err}");
}

#[test]
fn a_clean_close_and_a_cut_connection_both_end_the_stream() {
    let mut p = connected();
    assert_eq!(
        transfer(&mut p.client, &mut p.server, b"last words", 100, 100),
        b"last words"
    );
    p.client.close_notify();
    let mut out = [0u8; 64];
    assert_eq!(p.server.recv_into(&mut out).unwrap(), Received::Eof);

    let mut p = connected();
    p.sockets.1.shutdown(std::net::Shutdown::Both).unwrap(); // no close_notify
    assert_eq!(p.server.recv_into(&mut out).unwrap(), Received::Eof);
}

#[test]
fn plaintext_is_not_a_handshake() {
    let (a, mut b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let mut server = Session::new(&server_config(), a.as_raw_fd(), None).unwrap();
    use std::io::Write;
    b.write_all(b"NYPC\x00\x00\x00\x01 and a frame that is not TLS")
        .unwrap();
    let err = server
        .handshake()
        .expect_err("plaintext passed as a handshake");
    assert!(matches!(err, TlsError::Tls(_)), "{err}");
}

#[test]
fn bad_configuration_is_refused_with_what_is_wrong() {
    let err = TlsConfig::server(b"not a pem", &data("server.pem"), &data("server.key"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("CA"), "{err}");
    let err = TlsConfig::client(&data("ca.pem"), &data("client.pem"), b"")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("private key"), "{err}");
}

#[test]
fn data_that_comes_with_the_last_handshake_flight_waits_for_the_reader() {
    let mut p = pair(client_config("client"), "srv.server.nyala");
    // TLS 1.3: the client is done first, and writes at once.
    let mut client_done = false;
    for _ in 0..100 {
        if p.client.handshake().unwrap() == Progress::Done {
            client_done = true;
            break;
        }
        assert_eq!(p.server.handshake().unwrap(), Progress::WantRead);
    }
    assert!(client_done);
    assert_eq!(p.client.send(b"right behind the Finished").unwrap(), 0);
    assert_eq!(p.server.handshake().unwrap(), Progress::Done);
    let mut out = [0u8; 100];
    let Received::Data(n) = p.server.recv_into(&mut out).unwrap() else {
        panic!("the data was lost")
    };
    assert_eq!(&out[..n], b"right behind the Finished");
}

#[test]
fn a_send_while_records_wait_unread_keeps_them_in_order() {
    let mut p = connected();
    let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(p.server.send(&message).unwrap(), 0);
    // The client takes a little; whole records stay unread, in its buffer.
    let mut small = [0u8; 1000];
    let Received::Data(first) = p.client.recv_into(&mut small).unwrap() else {
        panic!("nothing came")
    };
    // rustls decrypts what waits before it encrypts: the send must still go out...
    assert_eq!(p.client.send(b"meanwhile").unwrap(), 0);
    let mut out = [0u8; 64];
    let Received::Data(n) = p.server.recv_into(&mut out).unwrap() else {
        panic!("the send was lost")
    };
    assert_eq!(&out[..n], b"meanwhile");
    // ...and what was waiting is read after it, whole and in order.
    let mut got = small[..first].to_vec();
    let mut big = vec![0u8; 7_000];
    while got.len() < message.len() {
        match p.client.recv_into(&mut big).unwrap() {
            Received::Data(n) => got.extend_from_slice(&big[..n]),
            other => panic!("{other:?} after {} bytes", got.len()),
        }
    }
    assert_eq!(got, message);
}

/// A pair whose handshake is done (the client's certificate a user's, the server's named
/// `srv.server.nyala`).
fn connected() -> Pair {
    let mut p = pair(client_config("client"), "srv.server.nyala");
    let (server, client) = shake(&mut p);
    server.unwrap();
    client.unwrap();
    p
}
