// tools/examples/rust — kvcache's C interface (include/kvcache/c_api.h) called
// from Rust: the declarations below mirror the header by hand (bindgen would
// generate them). Run by ctest (example.rust) where cargo is installed:
//   KVCACHE_LIB_DIR=build cargo run --manifest-path tools/examples/rust/Cargo.toml
use std::ffi::c_void;
use std::ffi::CStr;
use std::os::raw::c_char;

#[repr(C)]
struct KvcError {
    status: i32,
    message: [c_char; 256],
}
#[repr(C)]
#[derive(Default)]
struct KvcParams {
    dtype: i32,
    num_layers: u32,
    n_kv_heads: u32,
    head_dim: u32,
    strategy: i32,
    page_size: u32,
    enable_prefix_caching: i32,
    page_layout: i32,
    pool_arrangement: i32,
    n_devices: u32,
}
#[repr(C)]
struct KvcManager {
    _p: [u8; 0],
}
#[repr(C)]
struct KvcBatch {
    _p: [u8; 0],
}

extern "C" {
    fn kvc_manager_create(
        p: *const KvcParams,
        num_blocks: u32,
        max_batch: u32,
        max_seq_len: u32,
        out: *mut *mut KvcManager,
        err: *mut KvcError,
    ) -> i32;
    fn kvc_manager_destroy(m: *mut KvcManager);
    fn kvc_batch_create(out: *mut *mut KvcBatch, err: *mut KvcError) -> i32;
    fn kvc_batch_destroy(b: *mut KvcBatch);
    fn kvc_claim(m: *mut KvcManager, n: u32, ids: *mut u64, err: *mut KvcError) -> i32;
    fn kvc_fetch(
        m: *mut KvcManager,
        b: *mut KvcBatch,
        ids: *const u64,
        new_tokens: *const u32,
        n: u32,
        num_steps: u32,
        err: *mut KvcError,
    ) -> i32;
    fn kvc_store_kv(
        b: *const KvcBatch,
        layer: u32,
        k: *const f32,
        v: *const f32,
        row_offsets: *const u32,
        opts: *const c_void,
        pool: *mut c_void,
        err: *mut KvcError,
    ) -> i32;
    fn kvc_attention(
        b: *const KvcBatch,
        layer: u32,
        q: *const f32,
        n_q_heads: u32,
        row_offsets: *const u32,
        out: *mut f32,
        opts: *const c_void,
        pool: *mut c_void,
        err: *mut KvcError,
    ) -> i32;
    fn kvc_step(
        m: *mut KvcManager,
        ids: *const u64,
        valid: *const u32,
        n: u32,
        token_ids: *const u32,
        err: *mut KvcError,
    ) -> i32;
    fn kvc_release(m: *mut KvcManager, seq: u64, hint: i32, err: *mut KvcError) -> i32;
}

fn check(status: i32, err: &KvcError, what: &str) {
    if status != 0 {
        let msg = unsafe { CStr::from_ptr(err.message.as_ptr()) };
        panic!("{what}: status {status}: {}", msg.to_string_lossy());
    }
}

fn main() {
    let params = KvcParams {
        dtype: 2, /* bf16 */
        num_layers: 1,
        n_kv_heads: 2,
        head_dim: 64,
        strategy: 1, /* paged */
        page_size: 16,
        ..Default::default()
    };
    let mut err = KvcError {
        status: 0,
        message: [0; 256],
    };
    unsafe {
        let mut m = std::ptr::null_mut();
        check(
            kvc_manager_create(&params, 32, 4, 256, &mut m, &mut err),
            &err,
            "create",
        );
        let mut b = std::ptr::null_mut();
        check(kvc_batch_create(&mut b, &mut err), &err, "batch");
        let mut seq = 0u64;
        check(kvc_claim(m, 1, &mut seq, &mut err), &err, "claim");
        let n = 5u32;
        check(kvc_fetch(m, b, &seq, &n, 1, 1, &mut err), &err, "fetch");
        let rows = [0u32, n];
        let (k, v) = (vec![0.5f32; 5 * 2 * 64], vec![0.25f32; 5 * 2 * 64]);
        let q = vec![1.0f32; 5 * 4 * 64];
        let mut out = vec![0.0f32; q.len()];
        let null = std::ptr::null();
        check(
            kvc_store_kv(
                b,
                0,
                k.as_ptr(),
                v.as_ptr(),
                rows.as_ptr(),
                null,
                std::ptr::null_mut(),
                &mut err,
            ),
            &err,
            "store",
        );
        check(
            kvc_attention(
                b,
                0,
                q.as_ptr(),
                4,
                rows.as_ptr(),
                out.as_mut_ptr(),
                null,
                std::ptr::null_mut(),
                &mut err,
            ),
            &err,
            "attention",
        );
        check(
            kvc_step(m, &seq, &n, 1, std::ptr::null(), &mut err),
            &err,
            "step",
        );
        check(kvc_release(m, seq, 0, &mut err), &err, "release");
        let again = kvc_release(m, seq, 0, &mut err);
        println!(
            "out[0] = {}; release again -> status {again}: {}",
            out[0],
            CStr::from_ptr(err.message.as_ptr()).to_string_lossy()
        );
        // Every K row is the same, so each output is exactly V's value; a
        // second release is refused as KVC_UNKNOWN_SEQUENCE (2).
        assert!(out.iter().all(|&x| x == 0.25));
        assert_eq!(again, 2);
        kvc_batch_destroy(b);
        kvc_manager_destroy(m);
    }
}
