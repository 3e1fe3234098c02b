//! Rebuild the crate when a migration or a function file is added or removed:
//! `embed_migrations!` reads the migrations' directory at compile time, and cargo only tracks the
//! files a build embedded (`include_str!` of a function file), not new ones.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=functions");
}
