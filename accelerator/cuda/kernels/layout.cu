// permute, slice, concat, kv_append: one item per element written.

VGPU_KERNEL permute(long long lo, long long hi, long long d0, long long d1, long long d2, long long d3, long long p0,
		    long long p1, long long p2, long long p3, const float *x, float *out) {
	ITEM(i);
	long long d[4] = {d0, d1, d2, d3}, p[4] = {p0, p1, p2, p3}, j[4];
	long long rest = i;
	for (int k = 3; k >= 0; k--) {
		long long e = d[p[k]]; /* out's dimension k */
		j[p[k]] = rest % e;
		rest /= e;
	}
	out[i] = x[((j[0] * d1 + j[1]) * d2 + j[2]) * d3 + j[3]];
}

VGPU_KERNEL slice(long long lo, long long hi, long long outer, long long mid, long long inner, long long start,
		  long long len, const float *src, float *dst) {
	ITEM(i);
	long long o = i / (len * inner), j = i / inner % len, c = i % inner;
	dst[i] = src[(o * mid + start + j) * inner + c];
}

VGPU_KERNEL concat(long long lo, long long hi, long long outer, long long mid_a, long long mid_b, long long mid,
		   long long inner, const float *a, const float *b, float *out) {
	ITEM(i);
	long long o = i / (mid * inner), j = i / inner % mid, c = i % inner;
	out[i] = j < mid_a ? a[(o * mid_a + j) * inner + c] : b[(o * mid_b + j - mid_a) * inner + c];
}

VGPU_KERNEL kv_append(long long lo, long long hi, long long outer, long long cap, long long len, long long inner,
		      long long pos, const float *src, float *cache) {
	ITEM(i);
	long long o = i / (len * inner), j = i / inner % len, c = i % inner;
	cache[(o * cap + pos + j) * inner + c] = src[i];
}
