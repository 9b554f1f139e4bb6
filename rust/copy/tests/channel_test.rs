//! The data channel end to end on loopback: a `DataServer` serving real files, `download`
//! writing them into others.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nyala_common::{Classify, ErrorKind};
use nyala_copy::{
    download, CopyError, DataServer, Download, DownloadOptions, ServedFile, ServerOptions,
    TargetFile,
};

/// A file served with the length it had when opened.
struct Fixed {
    file: File,
    length: u64,
}

impl Fixed {
    fn open(path: &Path) -> Arc<dyn ServedFile> {
        let file = File::open(path).unwrap();
        let length = file.metadata().unwrap().len();
        Arc::new(Fixed { file, length })
    }
}

impl ServedFile for Fixed {
    fn length(&self) -> u64 {
        self.length
    }

    fn read_at(&self, offset: u64, dest: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(dest, offset)
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn options(chunk_bytes: u32, streams: usize) -> DownloadOptions {
    DownloadOptions {
        chunk_bytes,
        streams,
        attempts: 3,
        rate_bytes_per_s: 0,
        timeout: Duration::from_secs(10),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    sources: Vec<Vec<u8>>,
    served: Vec<Arc<dyn ServedFile>>,
    targets: Vec<File>,
    target_paths: Vec<std::path::PathBuf>,
}

fn fixture(sizes: &[usize]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut sources = Vec::new();
    let mut served = Vec::new();
    let mut targets = Vec::new();
    let mut target_paths = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u64 + 1);
        let path = dir.path().join(format!("source-{i}"));
        std::fs::write(&path, &data).unwrap();
        served.push(Fixed::open(&path));
        sources.push(data);
        let target = dir.path().join(format!("target-{i}"));
        targets.push(File::create(&target).unwrap());
        target_paths.push(target);
    }
    Fixture {
        _dir: dir,
        sources,
        served,
        targets,
        target_paths,
    }
}

impl Fixture {
    fn target_files(&self) -> Vec<TargetFile> {
        self.targets
            .iter()
            .zip(&self.sources)
            .enumerate()
            .map(|(i, (f, data))| TargetFile {
                index: i as u32,
                fd: f.as_raw_fd(),
                length: data.len() as u64,
            })
            .collect()
    }

    fn assert_copied(&self) {
        for (path, data) in self.target_paths.iter().zip(&self.sources) {
            assert!(
                std::fs::read(path).unwrap() == *data,
                "{} differs",
                path.display()
            );
        }
    }
}

/// `download` with a progress of its own.
fn fetch_all(
    address: &str,
    token: [u8; 16],
    files: &[TargetFile],
    options: &DownloadOptions,
) -> Result<(), CopyError> {
    download(address, token, files, options, &Download::new())
}

/// A source that serves one connection at a time (any beyond it is answered `BUSY`).
fn one_connection_server() -> DataServer {
    let options = ServerOptions {
        connections_max: 1,
        ..ServerOptions::default()
    };
    DataServer::bind("127.0.0.1:0", options).unwrap()
}

fn server(chunk_bytes_max: u32) -> DataServer {
    let options = ServerOptions {
        chunk_bytes_max,
        ..ServerOptions::default()
    };
    DataServer::bind("127.0.0.1:0", options).unwrap()
}

#[test]
fn every_file_arrives_whole_over_several_streams() {
    let fx = fixture(&[0, (10 << 20) + 123, 3, 1 << 20]);
    let server = server(4 << 20);
    let token = [1u8; 16];
    server.register(token, fx.served.clone());
    let progress = Download::new();
    let address = server.local_addr().to_string();
    download(
        &address,
        token,
        &fx.target_files(),
        &options(1 << 20, 4),
        &progress,
    )
    .unwrap();
    fx.assert_copied();
    let total: u64 = fx.sources.iter().map(|d| d.len() as u64).sum();
    assert_eq!(progress.bytes_done(), total);
    assert_eq!(server.bytes_served(), total);
    assert_eq!(progress.chunks_refetched(), 0);
}

#[test]
fn a_source_with_smaller_chunks_answers_short_and_the_target_asks_again() {
    let fx = fixture(&[(3 << 20) + 5]);
    let server = server(64 << 10);
    let token = [2u8; 16];
    server.register(token, fx.served.clone());
    let address = server.local_addr().to_string();
    fetch_all(&address, token, &fx.target_files(), &options(1 << 20, 2)).unwrap();
    fx.assert_copied();
}

#[test]
fn a_damaged_chunk_is_fetched_again_and_one_damaged_every_time_fails_the_copy() {
    let fx = fixture(&[5 << 20]);
    let server = server(4 << 20);
    let token = [3u8; 16];
    server.register(token, fx.served.clone());
    let address = server.local_addr().to_string();
    server.inject_corrupt_chunks(2);
    let progress = Download::new();
    download(
        &address,
        token,
        &fx.target_files(),
        &options(1 << 20, 1),
        &progress,
    )
    .unwrap();
    fx.assert_copied();
    assert_eq!(progress.chunks_refetched(), 2);

    server.inject_corrupt_chunks(3); // the first chunk, all three fetches
    let err = fetch_all(&address, token, &fx.target_files(), &options(1 << 20, 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    assert!(err.to_string().contains("CRC32C"), "{err}");
}

#[test]
fn an_unknown_session_a_wrong_length_and_a_file_not_in_the_session_are_errors() {
    let fx = fixture(&[1000]);
    let server = server(4 << 20);
    let token = [4u8; 16];
    server.register(token, fx.served.clone());
    let address = server.local_addr().to_string();

    let err = fetch_all(&address, [9u8; 16], &fx.target_files(), &options(512, 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    let mut wrong = fx.target_files();
    wrong[0].length = 999;
    let err = fetch_all(&address, token, &wrong, &options(512, 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    assert!(err.to_string().contains("listed 999 bytes"), "{err}");

    let mut missing = fx.target_files();
    missing[0].index = 1;
    let err = fetch_all(&address, token, &missing, &options(512, 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

    assert!(server.unregister(&token));
    let err = fetch_all(&address, token, &fx.target_files(), &options(512, 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[test]
fn a_cancelled_download_stops_and_says_so() {
    let fx = fixture(&[4 << 20]);
    let server = server(4 << 20);
    let token = [5u8; 16];
    server.register(token, fx.served.clone());
    let progress = Download::new();
    progress.cancel();
    let address = server.local_addr().to_string();
    let err = download(
        &address,
        token,
        &fx.target_files(),
        &options(1 << 20, 2),
        &progress,
    )
    .unwrap_err();
    assert!(matches!(err, CopyError::Cancelled), "{err}");
    assert_eq!(err.kind(), ErrorKind::Aborted);
    assert_eq!(progress.bytes_done(), 0);
}

#[test]
fn a_closed_server_is_a_network_error_and_a_foreign_request_is_refused() {
    let fx = fixture(&[100]);
    let server = server(4 << 20);
    let address = server.local_addr();

    let mut raw = TcpStream::connect(address).unwrap();
    raw.write_all(&[b'G'; 40]).unwrap();
    let mut head = [0u8; 24];
    raw.read_exact(&mut head).unwrap();
    assert_eq!(u32::from_le_bytes(head[0..4].try_into().unwrap()), 2); // INVALID_ARGUMENT
    let mut rest = Vec::new();
    raw.read_to_end(&mut rest).unwrap(); // then the server closes the connection
    assert!(String::from_utf8_lossy(&rest).contains("magic"));

    server.close();
    let address = address.to_string();
    let err = fetch_all(&address, [6u8; 16], &fx.target_files(), &options(512, 1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ServiceUnavailable, "{err}");
}

#[test]
fn connections_beyond_the_limit_are_answered_busy_and_the_copy_goes_on_over_the_rest() {
    let fx = fixture(&[3 << 20, 1 << 20]);
    let server = one_connection_server();
    let token = [8u8; 16];
    server.register(token, fx.served.clone());
    let first = TcpStream::connect(server.local_addr()).unwrap();
    // The acceptor registers the first before it accepts the second.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.connections() < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut second = TcpStream::connect(server.local_addr()).unwrap();
    second.write_all(&[0u8; 40]).unwrap(); // any first request
    let mut head = [0u8; 24];
    second.read_exact(&mut head).unwrap();
    assert_eq!(u32::from_le_bytes(head[0..4].try_into().unwrap()), 4); // BUSY

    // Four streams against a source that serves one connection: while the idle connection
    // above holds it, the last stream waits; once it is gone, one stream copies everything.
    let address = server.local_addr().to_string();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(first);
    });
    let progress = Download::new();
    download(
        &address,
        token,
        &fx.target_files(),
        &options(256 << 10, 4),
        &progress,
    )
    .unwrap();
    release.join().unwrap();
    fx.assert_copied();
    assert_eq!(progress.bytes_done(), 4 << 20);
}

#[test]
fn a_session_is_served_with_its_fixed_length_while_the_file_grows() {
    let fx = fixture(&[2 << 20]);
    let server = server(1 << 20);
    let token = [7u8; 16];
    server.register(token, fx.served.clone());
    // The source file grows after the session began: the copy still gets the first 2 MiB.
    let path = fx._dir.path().join("source-0");
    let mut grow = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    grow.write_all(&[0xAB; 4096]).unwrap();
    let address = server.local_addr().to_string();
    fetch_all(&address, token, &fx.target_files(), &options(1 << 20, 2)).unwrap();
    fx.assert_copied();
    assert!(server.idle_ms(&token).unwrap() < 5_000);
    assert_eq!(server.idle_ms(&[0u8; 16]), None);
}

#[test]
fn a_piece_handed_back_is_never_left_behind() {
    // One connection at a time, two streams, two pieces: often one stream copies its piece and
    // finds nothing left just as the other, refused, hands its piece back. The piece must still
    // be copied (by the refused stream itself, once the source has room).
    let fx = fixture(&[128 << 10]);
    let server = one_connection_server();
    let token = [9u8; 16];
    server.register(token, fx.served.clone());
    let address = server.local_addr().to_string();
    for _ in 0..30 {
        fetch_all(&address, token, &fx.target_files(), &options(64 << 10, 2)).unwrap();
        fx.assert_copied();
    }
}
