//! The credential a router presents to allocators: a raw token read from a file (never from the
//! command line, where `ps` would show it), re-read on SIGHUP.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamTokenError {
    #[error("{flag}: cannot read {path}: {source}")]
    Read {
        flag: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{flag}: {path} must hold one token of visible ASCII characters without spaces")]
    Invalid { flag: &'static str, path: String },
}

/// The `Authorization` value a router sends upstream.
pub struct UpstreamToken {
    flag: &'static str,
    path: PathBuf,
    header: RwLock<String>,
}

impl std::fmt::Debug for UpstreamToken {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamToken")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn read(flag: &'static str, path: &Path) -> Result<String, UpstreamTokenError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| UpstreamTokenError::Read {
        flag,
        path: shown.clone(),
        source,
    })?;
    // A trailing newline is what editors and `echo` leave; anything else inside is refused.
    let token = text.trim();
    let invalid = || UpstreamTokenError::Invalid {
        flag,
        path: shown.clone(),
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid());
    }
    Ok(format!("Bearer {token}"))
}

impl UpstreamToken {
    /// Read the token file; `flag` names the flag and variable that set it, for refusals.
    pub fn load(flag: &'static str, path: &Path) -> Result<UpstreamToken, UpstreamTokenError> {
        Ok(UpstreamToken {
            flag,
            path: path.to_owned(),
            header: RwLock::new(read(flag, path)?),
        })
    }

    /// `Bearer <token>`; mark the header sensitive where it is sent.
    pub fn header(&self) -> String {
        self.header
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Re-read the file; on error the token in force stays.
    pub fn reload(&self) -> Result<(), UpstreamTokenError> {
        let value = read(self.flag, &self.path)?;
        *self
            .header
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
        tracing::info!(path = %self.path.display(), "upstream token reloaded");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_trims_and_refuses() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "s3cret\n").unwrap();
        let token = UpstreamToken::load("--upstream-token-file (T)", file.path()).unwrap();
        assert_eq!(token.header(), "Bearer s3cret");
        std::fs::write(file.path(), "two words\n").unwrap();
        let error = token.reload().unwrap_err().to_string();
        assert!(error.starts_with("--upstream-token-file (T)"), "{error}");
        assert_eq!(token.header(), "Bearer s3cret");
        std::fs::write(file.path(), "").unwrap();
        assert!(token.reload().is_err());
        std::fs::write(file.path(), "n3w").unwrap();
        token.reload().unwrap();
        assert_eq!(token.header(), "Bearer n3w");
        assert!(UpstreamToken::load("f", Path::new("/nonexistent")).is_err());
    }
}
