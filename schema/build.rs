//! Rebuild the crate when a migration file is added or removed: `embed_migrations!` reads the
//! directory at compile time, and cargo only tracks the files it embedded, not new ones.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
