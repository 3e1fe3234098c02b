//! The run's clients as the routers know them: authentication is on, and one client has a tight
//! per-client rate limit in the routers' auth file, so `429` answers are part of every history.
//!
//! Tokens are fresh random values per run; the auth file holds only their SHA-256, as the
//! services require.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use rand::Rng;
use sha2::{Digest, Sha256};

/// The client name (and auth-file line) of every workload client but the limited one.
pub const CLIENT: &str = "chaos";
/// The limited client's name in the auth file.
pub const LIMITED_CLIENT: &str = "chaos-limited";
/// The limited client's requests per second and burst at each router: well below what one
/// workload client sends, so a good share of its operations are answered `429`.
pub const LIMITED_RATE: u32 = 8;
pub const LIMITED_BURST: u32 = 4;

/// Bearer tokens of the run.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// `reserve` and `admin` (adjustments), no limit.
    pub client: String,
    /// `reserve` only, limited to [`LIMITED_RATE`] per second.
    pub limited: String,
}

fn random_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// New tokens, and the routers' auth file for them at `path`.
pub fn write_auth_file(path: &Path) -> Result<Tokens> {
    let tokens = Tokens {
        client: random_token(),
        limited: random_token(),
    };
    let file = format!(
        "# chaos run clients (tokens are random per run)\n\
         {CLIENT} reserve,admin {}\n\
         {LIMITED_CLIENT} reserve {} rate={LIMITED_RATE} burst={LIMITED_BURST}\n",
        sha256_hex(&tokens.client),
        sha256_hex(&tokens.limited),
    );
    std::fs::write(path, file).with_context(|| format!("writing {}", path.display()))?;
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_lowercase_sha256_hex() {
        assert_eq!(
            sha256_hex("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(random_token().len(), 64);
    }
}
