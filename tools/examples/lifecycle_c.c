/* tools/examples/lifecycle_c.c — the C interface's example (docs/c_api.md),
 * compiled as C99 with -pedantic -Werror and run by ctest
 * (example.lifecycle_c), so it always matches kvcache/c_api.h.
 *
 * Two sequences on a paged bf16 cache: claim, fetch a prefill of 7 and 20
 * tokens, store their K/V and attend (4 query heads over 2 KV heads: GQA),
 * commit, then one decode step, then release; and one error provoked on
 * purpose. Exits 0 when every value checked is as expected. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvcache/c_api.h"

#define HEAD_DIM 64
#define KV_HEADS 2
#define Q_HEADS 4

static int check(kvc_status status, const kvc_error* err, const char* what) {
  if (status != KVC_OK) {
    fprintf(stderr, "%s failed: %s: %s\n", what, kvc_status_name(status), err->message);
    return 0;
  }
  return 1;
}

/* One step: store rows' K/V (every element k_value / v_value) into layer 0
 * and attend with queries of ones; returns out[0] or NAN on failure. */
static float store_and_attend(const kvc_batch* batch, const uint32_t* row_offsets, uint32_t rows,
                              float k_value, float v_value, kvc_error* err) {
  const size_t kv = (size_t)rows * KV_HEADS * HEAD_DIM, qo = (size_t)rows * Q_HEADS * HEAD_DIM;
  float* k = malloc(kv * sizeof(float));
  float* v = malloc(kv * sizeof(float));
  float* q = malloc(qo * sizeof(float));
  float* out = malloc(qo * sizeof(float));
  float result = NAN;
  size_t i;
  if (k == NULL || v == NULL || q == NULL || out == NULL) goto done;
  for (i = 0; i < kv; ++i) {
    k[i] = k_value;
    v[i] = v_value;
  }
  for (i = 0; i < qo; ++i) q[i] = 1.0f;
  if (!check(kvc_store_kv(batch, 0, k, v, row_offsets, NULL, NULL, err), err, "store_kv")) {
    goto done;
  }
  if (!check(kvc_attention(batch, 0, q, Q_HEADS, row_offsets, out, NULL, NULL, err), err,
             "attention")) {
    goto done;
  }
  result = out[0];
done:
  free(k);
  free(v);
  free(q);
  free(out);
  return result;
}

int main(void) {
  kvc_params params = {0};
  kvc_manager* manager = NULL;
  kvc_batch* batch = NULL;
  kvc_error err;
  kvc_manager_stats stats;
  uint64_t seqs[2];
  const uint32_t prompt[2] = {7, 20}, prefill_rows[3] = {0, 7, 27};
  const uint32_t one[2] = {1, 1}, decode_rows[3] = {0, 1, 2};
  uint32_t length0 = 0, length1 = 0;
  float prefill_out, decode_out;
  int ok = 0;

  params.dtype = KVC_DTYPE_BF16;
  params.num_layers = 2;
  params.n_kv_heads = KV_HEADS;
  params.head_dim = HEAD_DIM;
  params.strategy = KVC_STRATEGY_PAGED;
  params.page_size = 16;
  params.page_layout = KVC_LAYOUT_NHD;

  if (!check(kvc_manager_create(&params, 64, 8, 512, &manager, &err), &err, "manager_create") ||
      !check(kvc_batch_create(&batch, &err), &err, "batch_create") ||
      !check(kvc_claim(manager, 2, seqs, &err), &err, "claim") ||
      !check(kvc_fetch(manager, batch, seqs, prompt, 2, 1, &err), &err, "fetch")) {
    goto done;
  }
  /* Every K row the same: the attention output is exactly V's value. */
  prefill_out = store_and_attend(batch, prefill_rows, 27, 0.5f, 0.25f, &err);
  if (isnan(prefill_out) || !check(kvc_step(manager, seqs, prompt, 2, NULL, &err), &err, "step") ||
      !check(kvc_fetch(manager, batch, seqs, one, 2, 1, &err), &err, "fetch (decode)")) {
    goto done;
  }
  decode_out = store_and_attend(batch, decode_rows, 2, 0.5f, 0.25f, &err);
  if (isnan(decode_out) || !check(kvc_step(manager, seqs, one, 2, NULL, &err), &err, "step") ||
      !check(kvc_cache_length(manager, seqs[0], &length0, &err), &err, "cache_length") ||
      !check(kvc_cache_length(manager, seqs[1], &length1, &err), &err, "cache_length") ||
      !check(kvc_manager_stats_get(manager, &stats, &err), &err, "stats")) {
    goto done;
  }
  printf("cache lengths %u, %u; out = %.3f, %.3f; %u of %u pages free\n", length0, length1,
         prefill_out, decode_out, stats.free_blocks, stats.total_blocks);

  if (!check(kvc_release(manager, seqs[0], KVC_REUSE_UNKNOWN, &err), &err, "release") ||
      !check(kvc_release(manager, seqs[1], KVC_REUSE_UNKNOWN, &err), &err, "release")) {
    goto done;
  }
  /* Releasing again is refused, names the sequence, and changes nothing. */
  if (kvc_release(manager, seqs[0], KVC_REUSE_UNKNOWN, &err) != KVC_UNKNOWN_SEQUENCE) goto done;
  printf("release again: %s: %s\n", kvc_status_name(err.status), err.message);

  ok = length0 == 8 && length1 == 21 && prefill_out == 0.25f && decode_out == 0.25f &&
       kvc_check_invariants(manager, &err) == KVC_OK;
done:
  kvc_batch_destroy(batch);
  kvc_manager_destroy(manager);
  return ok ? 0 : 1;
}
