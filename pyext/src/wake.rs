//! `Wake`: what a writer's thread waits on in the client's write pipe, and the hand-over
//! that lets 64 writer threads take turns without fighting for the GIL.
//!
//! A thread woken while another holds the GIL wakes twice: once from its wait, and once more
//! when the GIL comes free (it sleeps on the GIL in between). `wait(timeout, relay)` first
//! gives the GIL up, then wakes `relay`, then sleeps: the woken thread finds the GIL free
//! (docs/performance.md, "Writer threads that take turns").

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// How often a long wait looks at signals (only the main thread's wait sees them).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// An event: `set`, `wait`, `clear`, as `threading.Event`'s, whose `wait` can wake another.
#[pyclass(module = "nyala._native", frozen)]
pub struct Wake {
    flag: Mutex<bool>,
    woken: Condvar,
}

impl Wake {
    fn raise(&self) {
        let mut flag = self.flag.lock();
        if !*flag {
            *flag = true;
            self.woken.notify_all();
        }
    }
}

#[pymethods]
impl Wake {
    #[new]
    fn new() -> Self {
        Wake {
            flag: Mutex::new(false),
            woken: Condvar::new(),
        }
    }

    /// Sets it: its waiters return.
    fn set(&self) {
        self.raise();
    }

    /// Clears it.
    fn clear(&self) {
        *self.flag.lock() = false;
    }

    /// Whether it is set.
    fn is_set(&self) -> bool {
        *self.flag.lock()
    }

    /// Waits up to `timeout` seconds for it to be set (True once set, at once if it is;
    /// False after the timeout). With `relay`, sets `relay` first, after giving up the GIL.
    /// Signals are checked every `SIGNAL_CHECK` (Ctrl-C interrupts the wait).
    #[pyo3(signature = (timeout, relay=None))]
    fn wait(&self, py: Python<'_>, timeout: f64, relay: Option<Py<Wake>>) -> PyResult<bool> {
        if !timeout.is_finite() || timeout < 0.0 {
            return Err(PyValueError::new_err(format!(
                "a wait of {timeout} seconds"
            )));
        }
        if relay.is_none() && *self.flag.lock() {
            return Ok(true);
        }
        let mut relay = relay.as_ref().map(|r| r.get());
        // None: too far to represent, as good as never.
        let deadline = Duration::try_from_secs_f64(timeout)
            .ok()
            .and_then(|d| Instant::now().checked_add(d));
        loop {
            let check_at = Instant::now() + SIGNAL_CHECK;
            let slice_end = deadline.map_or(check_at, |d| d.min(check_at));
            let set = py.detach(|| {
                if let Some(relay) = relay.take() {
                    relay.raise();
                }
                let mut flag = self.flag.lock();
                while !*flag {
                    if self.woken.wait_until(&mut flag, slice_end).timed_out() {
                        break;
                    }
                }
                *flag
            });
            if set || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(set);
            }
            py.check_signals()?;
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Wake>()?;
    Ok(())
}
