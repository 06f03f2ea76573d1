//! Bakes libtorch's lib directory into the rpath of this crate's test
//! binaries, so they run without LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(root) = std::env::var("LIBTORCH") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{root}/lib");
    }
}
