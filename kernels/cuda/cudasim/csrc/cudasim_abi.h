// cudasim_abi.h: what the simulation header (cudasim_kernel.h, compiled
// into every kernel module) and the simulator library (cudasim.cpp) share:
// the warp operations' codes, the WMMA fragment types and the operands a
// lane passes to a product's rendezvous.
#pragma once

// Warp operations (rpac_sim_warp's op): a rendezvous of exactly the lanes
// in the mask.
enum { RPAC_SHFL_IDX = 0, RPAC_SHFL_DOWN = 1, RPAC_SHFL_UP = 2, RPAC_SHFL_XOR = 3, RPAC_ANY = 4, RPAC_ALL = 5,
       RPAC_BALLOT = 6, RPAC_SYNCWARP = 7, RPAC_MMA_SYNC = 8 };

// The fragment types; the simulator draws a layout for each.
enum { RPAC_FRAG_A_ROW = 0, RPAC_FRAG_A_COL = 1, RPAC_FRAG_B_ROW = 2, RPAC_FRAG_B_COL = 3, RPAC_FRAG_ACC = 4,
       RPAC_FRAG_KINDS = 5 };

// rpac_sim_mma_args: one lane's operands at a product's rendezvous (its
// value there): the simulator reads every lane's a, b and c and writes
// each lane's d (8 elements each).
struct rpac_sim_mma_args {
    const unsigned short* a;
    const unsigned short* b;
    int a_kind, b_kind;
    const float* c;
    float* d;
};
