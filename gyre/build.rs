//! Link settings of the `gyre` binary:
//! - an rpath to libtorch's lib directory, so it runs without LD_LIBRARY_PATH;
//! - libtorch_cuda linked with --no-as-needed: nothing references its symbols
//!   directly, so the linker would otherwise drop it and CUDA would never be
//!   seen at run time, even on a GPU machine.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(root) = std::env::var("LIBTORCH") {
        let lib = format!("{root}/lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        // The CUDA runtime engine/csrc/graph.cpp links against.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{root}/../nvidia/cu13/lib");
        if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-search=native={lib}");
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
            println!("cargo:rustc-link-arg=-ltorch_cuda");
            println!("cargo:rustc-link-arg=-Wl,--as-needed");
        }
    }
}
