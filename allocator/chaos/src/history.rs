//! The recorded history: JSON lines written as operations complete and faults end.
//!
//! Times are taken twice: milliseconds on the harness's monotonic clock since the run started
//! (for ordering and durations; never jumps) and wall-clock milliseconds since the Unix epoch
//! (to line records up with process logs and the database's timestamps).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde_json::Value;

/// The run's clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Monotonic milliseconds since the run started.
    pub fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Wall-clock milliseconds since the Unix epoch.
    pub fn wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// An append-only JSON-lines file shared by the tasks of a run.
pub struct JsonLines {
    out: Mutex<BufWriter<File>>,
}

impl JsonLines {
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            out: Mutex::new(BufWriter::new(file)),
        })
    }

    pub fn write(&self, record: &Value) {
        let mut out = self.out.lock().expect("history writer poisoned");
        // A record that cannot be written would make the history silently incomplete.
        serde_json::to_writer(&mut *out, record).expect("writing a history record");
        out.write_all(b"\n").expect("writing a history record");
    }

    pub fn flush(&self) -> Result<()> {
        Ok(self.out.lock().expect("history writer poisoned").flush()?)
    }
}
