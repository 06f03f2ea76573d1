//! Bakes libtorch's lib directory into the rpath of this crate's test
//! binaries (they link the engine), and the CUDA runtime's beside torch, so they run without LD_LIBRARY_PATH. The
//! `gyre` binary's own link settings live in `gyre/build.rs`.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(root) = std::env::var("LIBTORCH") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{root}/lib");
        // The CUDA runtime engine/csrc/graph.cpp links against.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{root}/../nvidia/cu13/lib");
    }
}
