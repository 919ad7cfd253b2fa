// tail_split's arithmetic: how the pieces of a persistent kernel's cut last round fall (flash_fwd.cu: tail_pieces,
// tail_combine). Plain C++ (host and device), so that tests/test_tail_split.py compiles it with the host compiler and
// checks it against its Python twin, space/wgmma.py's TailPlan.
//
// The loader decides the cut (space.wgmma.tail_plan, for the launch's grid) and passes it in the parameter block
// (tail_full_end, tail_ctas): tiles [0, full_end) run whole in the full rounds; the tiles after them, n key tiles
// each, are W = (tiles - full_end) × n units (one key tile of one tile) that CTAs 0 .. ctas-1 share out as equal
// contiguous ranges, CTA i taking units [floor(i·W / ctas), floor((i+1)·W / ctas)). The plan has more CTAs than cut
// tiles, so a range is at most a tile long and covers pieces of at most two tiles; piece k (0, 1) of CTA i writes
// its partials to slot 2i + k.
#pragma once

#if defined(__CUDACC__)
#define AT_TAIL_FN __host__ __device__ __forceinline__
#else
#define AT_TAIL_FN inline
#endif

namespace tail_split {

struct Plan {
    int full_end;     // tiles [0, full_end) run whole in the full rounds, [full_end, tiles) are cut
    int ctas;         // CTAs that take a share of the cut tiles (0: no cut)
    int n;            // key tiles per tile
    long long units;  // (tiles - full_end) × n
};

AT_TAIL_FN Plan make_plan(int tiles, int full_end, int ctas, int n) {
    return Plan{full_end, ctas, n, static_cast<long long>(tiles - full_end) * n};
}

// The first unit of CTA i's share (its share ends where CTA i + 1's starts).
AT_TAIL_FN long long start(const Plan& t, int i) { return static_cast<long long>(i) * t.units / t.ctas; }

// The CTA whose share holds unit u: the largest i with start(i) <= u.
AT_TAIL_FN int cta_of(const Plan& t, long long u) { return static_cast<int>(((u + 1) * t.ctas - 1) / t.units); }

// Piece k (0 or 1) of CTA i: its tile among the cut ones and its key tiles [n_begin, n_end); false if the CTA has
// no such piece (no share, or a share inside one tile has no second piece).
struct Piece {
    int tile, n_begin, n_end;
};
AT_TAIL_FN bool piece(const Plan& t, int i, int k, Piece& out) {
    if (i >= t.ctas) return false;
    const long long first = start(t, i), end = start(t, i + 1);
    const int j = static_cast<int>(first / t.n) + k;
    const long long tile_begin = static_cast<long long>(j) * t.n;
    if (tile_begin >= end) return false;
    out.tile = j;
    out.n_begin = first > tile_begin ? static_cast<int>(first - tile_begin) : 0;
    out.n_end = end - tile_begin < t.n ? static_cast<int>(end - tile_begin) : t.n;
    return true;
}

// The partial slot CTA i wrote its piece of cut tile j to: 2i if its share starts in j, else 2i + 1.
AT_TAIL_FN int slot(const Plan& t, int i, int j) {
    return 2 * i + (start(t, i) < static_cast<long long>(j) * t.n ? 1 : 0);
}

// The slot of CTA i's piece of the tile whose first CTA is i0, given slot0 = slot(t, i0, j): only the first CTA's share
// may start before the tile; every later one's starts inside it (cta_of: the largest i with start(i) <= the tile's
// first unit), so its slot is 2i. Spares the combine a 64-bit division per piece.
AT_TAIL_FN int slot_after(int i, int i0, int slot0) { return i == i0 ? slot0 : 2 * i; }

}  // namespace tail_split
