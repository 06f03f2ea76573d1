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
    // The examples (cuda_check, greedy, steptime) run on GPU machines: link
    // libtorch_cuda with --no-as-needed, as the gyre binary does, or the
    // linker drops it and CUDA is never seen at run time.
    let lib = format!("{root}/lib");
    println!("cargo:rustc-link-search=native={lib}");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-search=native={lib}");
        println!("cargo:rustc-link-arg-examples=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg-examples=-ltorch_cuda");
        println!("cargo:rustc-link-arg-examples=-Wl,--as-needed");
    }
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    println!("cargo:rerun-if-changed=csrc/graph.cpp");
    println!("cargo:rerun-if-changed=csrc/fused.cpp");
    println!("cargo::rustc-check-cfg=cfg(gyre_cuda_graphs)");
    // CUDA graphs (csrc/graph.cpp) and the fused kernels' host side
    // (csrc/fused.cpp) need the CUDA runtime's headers: the
    // CUDA wheels torch depends on carry them beside torch.
    let cuda_include = [
        format!("{root}/../nvidia/cu13/include"),
        format!("{root}/../nvidia/cuda_runtime/include"),
        std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into()) + "/include",
    ]
    .into_iter()
    .find(|d| std::path::Path::new(d).join("cuda_runtime_api.h").exists());
    // cuda_runtime.h also wants the compiler's `crt/host_config.h`, which
    // the runtime wheel lacks; torch's Triton dependency carries it.
    let crt_include = [
        format!("{root}/../triton/backends/nvidia/include"),
        std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into()) + "/include",
    ]
    .into_iter()
    .find(|d| std::path::Path::new(d).join("crt/host_config.h").exists());
    let has_cuda_lib = std::path::Path::new(&lib).join("libtorch_cuda.so").exists();
    if let (Some(inc), Some(crt), true) = (cuda_include, crt_include, has_cuda_lib) {
        cc::Build::new()
            .cpp(true)
            .file("csrc/graph.cpp")
            .file("csrc/fused.cpp")
            .include(format!("{root}/include"))
            .include(format!("{root}/include/torch/csrc/api/include"))
            .include(inc)
            .include(crt)
            .flag("-std=c++17")
            .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
            .flag("-DGLOG_USE_GLOG_EXPORT")
            .flag_if_supported("-Wno-unused-parameter")
            .warnings(false)
            .compile("gyre_graph");
        // The CUDA runtime the headers' inline functions call: torch's own
        // (found beside torch at run time: rpath here, LD_LIBRARY_PATH on a
        // GPU machine, see tests/gpu/device.sh).
        let cudart = format!("{root}/../nvidia/cu13/lib");
        if std::path::Path::new(&cudart)
            .join("libcudart.so.13")
            .exists()
        {
            println!("cargo:rustc-link-search=native={cudart}");
            println!("cargo:rustc-link-arg=-Wl,-rpath,{cudart}");
            println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
        } else {
            println!("cargo:rustc-link-lib=dylib=cudart");
        }
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
        println!("cargo:rustc-cfg=gyre_cuda_graphs");
    }
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
