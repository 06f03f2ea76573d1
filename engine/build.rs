//! Bakes libtorch's lib directory into the rpath of this crate's test
//! binaries, so they run without LD_LIBRARY_PATH, and compiles
//! `csrc/flash.cpp` (the C entry point to libtorch's varlen flash attention
//! that tch does not bind) against libtorch's headers.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=csrc/flash.cpp");
    let Ok(root) = std::env::var("LIBTORCH") else {
        panic!("LIBTORCH must point at libtorch (the Makefile sets it to the venv's torch)");
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{root}/lib");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .file("csrc/flash.cpp")
        .include(format!("{root}/include"))
        .include(format!("{root}/include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(false)
        .compile("gyre_flash");
}
