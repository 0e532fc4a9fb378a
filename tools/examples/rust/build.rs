// Links the kvcache static library (and what it needs) into the example.
// KVCACHE_LIB_DIR: the folder holding libkvcache.a (a CMake build folder).
fn main() {
    let dir = std::env::var("KVCACHE_LIB_DIR")
        .expect("KVCACHE_LIB_DIR: the folder holding libkvcache.a");
    println!("cargo:rerun-if-env-changed=KVCACHE_LIB_DIR");
    println!("cargo:rerun-if-changed={dir}/libkvcache.a");
    println!("cargo:rustc-link-search=native={dir}");
    println!("cargo:rustc-link-lib=static=kvcache");
    // Highway, xxHash, liburing (the disk tier) and the C++ runtime: the
    // library's own dependencies (what `pkg-config --libs kvcache` lists for
    // an installed kvcache).
    for lib in ["hwy", "xxhash", "uring", "stdc++"] {
        println!("cargo:rustc-link-lib={lib}");
    }
}
