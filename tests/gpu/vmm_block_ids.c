/* What the driver reports as a VMM physical allocation's identity while an allocator remaps one
 * reserved range the way PyTorch's expandable segments do: chunks mapped back to back, unmapped,
 * released, and new chunks mapped at the same addresses. The library names a segment by its
 * CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID (falling back to BUFFER_ID); a peer would read stale memory
 * if a new physical allocation at a reused address came back with an id seen before.
 *
 * Prints, per mapping made, the address, MEMORY_BLOCK_ID, BUFFER_ID and MAPPING_BASE_ADDR/SIZE,
 * then "ids unique: yes/no" over every physical allocation made. Exits 1 when an id repeats or a
 * call fails. Build: gcc -O2 -I<cuda>/include vmm_block_ids.c -lcuda. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    CUresult rc_ = (call);                                                            \
    if (rc_ != CUDA_SUCCESS) {                                                        \
      const char* s_ = NULL;                                                          \
      cuGetErrorString(rc_, &s_);                                                     \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?");    \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

enum { CHUNKS = 4, ROUNDS = 50 };

typedef struct {
  unsigned long long block_id, buffer_id, base, size;
} Ids;

static Ids ids_of(CUdeviceptr p) {
  Ids out = {0, 0, 0, 0};
  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                  CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
  void* data[4] = {&out.block_id, &out.buffer_id, &out.base, &out.size};
  CHECK(cuPointerGetAttributes(4, attrs, data, p));
  return out;
}

int main(void) {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  size_t chunk = gran < (2u << 20) ? (2u << 20) : gran;
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, chunk * CHUNKS, 0, 0, 0));
  CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUmemGenericAllocationHandle h[CHUNKS] = {0};
  unsigned long long seen_block[CHUNKS * (ROUNDS + 1)], seen_buffer[CHUNKS * (ROUNDS + 1)];
  int n = 0, repeats = 0;
  for (int round = 0; round <= ROUNDS; ++round) {
    /* Round 0 maps every chunk; later rounds replace one or two chunks (allocator churn). */
    for (int c = 0; c < CHUNKS; ++c) {
      int replace = round == 0 || c == round % CHUNKS || (round % 3 == 0 && c == (round + 1) % CHUNKS);
      if (!replace) continue;
      CUdeviceptr at = va + (CUdeviceptr)c * chunk;
      if (h[c]) {
        CHECK(cuMemUnmap(at, chunk));
        CHECK(cuMemRelease(h[c]));
      }
      CHECK(cuMemCreate(&h[c], chunk, &prop, 0));
      CHECK(cuMemMap(at, chunk, 0, h[c], 0));
      CHECK(cuMemSetAccess(at, chunk, &access, 1));
      Ids ids = ids_of(at + 4096);
      for (int i = 0; i < n; ++i) {
        if (seen_block[i] == ids.block_id) {
          printf("REPEAT block id %llu (round %d chunk %d)\n", ids.block_id, round, c);
          ++repeats;
        }
      }
      seen_block[n] = ids.block_id;
      seen_buffer[n] = ids.buffer_id;
      ++n;
      if (round < 3 || round == ROUNDS)
        printf("round %d chunk %d at %#llx: block_id %llu buffer_id %llu mapping [%#llx, +%llu)\n",
               round, c, (unsigned long long)at, ids.block_id, ids.buffer_id, ids.base, ids.size);
    }
  }
  /* Two chunks mapped back to back: does one pointer query tell them apart? */
  Ids a = ids_of(va), b = ids_of(va + chunk);
  printf("neighbours: block ids %llu / %llu, buffer ids %llu / %llu\n", a.block_id, b.block_id,
         a.buffer_id, b.buffer_id);
  int buffer_repeats = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) buffer_repeats += seen_buffer[i] == seen_buffer[j];
  printf("physical allocations made: %d, block id repeats: %d, buffer id repeats: %d\n", n,
         repeats, buffer_repeats);
  printf("ids unique: %s\n", repeats == 0 ? "yes" : "no");
  for (int c = 0; c < CHUNKS; ++c) {
    CHECK(cuMemUnmap(va + (CUdeviceptr)c * chunk, chunk));
    CHECK(cuMemRelease(h[c]));
  }
  CHECK(cuMemAddressFree(va, chunk * CHUNKS));
  return repeats == 0 ? 0 : 1;
}
