//! `nyala._native.TlsConfig` and `TlsSession`: the consensus peer channel's TLS
//! (`nyala_tls`), driven by `nyala.rpc.tls_socket`'s asyncio transport. The socket and its
//! readiness stay Python's; each call does as much TLS work as the socket allows, with the
//! GIL released.

use nyala_tls::{Progress, Received, Session, TlsConfig, TlsError};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyConnectionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTlsConfig>()?;
    m.add_class::<PyTlsSession>()?;
    Ok(())
}

fn config_error(e: TlsError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn session_error(e: TlsError) -> PyErr {
    PyConnectionError::new_err(e.to_string())
}

/// One side's TLS configuration (certificate, key, the CA peers are checked against).
#[pyclass(name = "TlsConfig", module = "nyala._native", frozen)]
pub struct PyTlsConfig {
    inner: TlsConfig,
}

#[pymethods]
impl PyTlsConfig {
    /// A server's side: shows `cert_pem` and requires a client certificate of `ca_pem`.
    #[staticmethod]
    fn server(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> PyResult<Self> {
        let inner = TlsConfig::server(ca_pem, cert_pem, key_pem).map_err(config_error)?;
        Ok(PyTlsConfig { inner })
    }

    /// A client's side: shows `cert_pem` and checks the server's certificate against
    /// `ca_pem` and the session's server name.
    #[staticmethod]
    fn client(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> PyResult<Self> {
        let inner = TlsConfig::client(ca_pem, cert_pem, key_pem).map_err(config_error)?;
        Ok(PyTlsConfig { inner })
    }

    /// Whether this is a server's side.
    #[getter]
    fn server_side(&self) -> bool {
        matches!(self.inner, TlsConfig::Server(_))
    }
}

/// A TLS session over a connected non-blocking socket's descriptor, which the caller keeps
/// open while the session is used.
#[pyclass(name = "TlsSession", module = "nyala._native")]
pub struct PyTlsSession {
    inner: Session,
}

#[pymethods]
impl PyTlsSession {
    #[new]
    #[pyo3(signature = (config, fd, server_name = None))]
    fn new(config: &PyTlsConfig, fd: i32, server_name: Option<&str>) -> PyResult<Self> {
        let inner = Session::new(&config.inner, fd, server_name).map_err(config_error)?;
        Ok(PyTlsSession { inner })
    }

    /// Advances the handshake: 0 done, 1 call again once readable, 2 once writable.
    /// `ConnectionError` if it failed.
    fn handshake(&mut self, py: Python<'_>) -> PyResult<u8> {
        let progress = py
            .detach(|| self.inner.handshake())
            .map_err(session_error)?;
        Ok(match progress {
            Progress::Done => 0,
            Progress::WantRead => 1,
            Progress::WantWrite => 2,
        })
    }

    /// Reads plaintext into the writable buffer `buffer`: the bytes read, -1 if none can be
    /// yet (wait until readable), 0 at the end of the connection.
    fn recv_into(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<isize> {
        let view = PyBuffer::<u8>::get(buffer)?;
        if view.readonly() || !view.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "recv_into needs a writable contiguous buffer",
            ));
        }
        let (ptr, len) = (view.buf_ptr() as usize, view.len_bytes());
        let received = py
            .detach(|| {
                // SAFETY: the buffer is writable, contiguous and stays exported (so it can be
                // neither freed nor resized) while `view` lives.
                let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
                self.inner.recv_into(out)
            })
            .map_err(session_error)?;
        Ok(match received {
            Received::Data(n) => n as isize,
            Received::WouldBlock => -1,
            Received::Eof => 0,
        })
    }

    /// Encrypts all of `data` and writes what the socket takes: the plaintext bytes whose
    /// records still wait (0: all written; else `flush` once writable).
    fn send(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let view = PyBuffer::<u8>::get(data)?;
        if !view.is_c_contiguous() {
            let copy = view.to_vec(py)?;
            return py.detach(|| self.inner.send(&copy)).map_err(session_error);
        }
        let (ptr, len) = (view.buf_ptr() as usize, view.len_bytes());
        py.detach(|| {
            // SAFETY: contiguous, and kept exported by `view` for the call.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            self.inner.send(bytes)
        })
        .map_err(session_error)
    }

    /// Writes waiting records; returns what `send` does.
    fn flush(&mut self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.inner.flush()).map_err(session_error)
    }

    /// Whether decrypted plaintext waits in the session, which the socket's readiness does
    /// not show (read it without waiting).
    fn has_buffered(&self) -> bool {
        self.inner.has_buffered()
    }

    /// Whether records still wait to be written.
    fn wants_write(&self) -> bool {
        self.inner.wants_write()
    }

    /// The peer's certificate (DER) once the handshake is done, else None.
    fn peer_certificate<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner
            .peer_certificate()
            .map(|der| PyBytes::new(py, der))
    }

    /// The negotiated cipher suite's name, once the handshake is done.
    fn cipher(&self) -> Option<String> {
        self.inner.cipher()
    }

    /// Sends TLS's close_notify (best effort; the caller closes the socket next).
    fn close_notify(&mut self) {
        self.inner.close_notify();
    }
}
