// add, mul, relu, silu, gelu: one item per element of out, which may be
// exactly an input (each thread reads its element before writing it).

VGPU_KERNEL add(long long lo, long long hi, long long rows, long long cols, long long b_rows, const float *a,
		const float *b, float *out) {
	ITEM(i);
	out[i] = a[i] + b[b_rows == 1 ? i % cols : i];
}

VGPU_KERNEL mul(long long lo, long long hi, long long rows, long long cols, long long b_rows, const float *a,
		const float *b, float *out) {
	ITEM(i);
	out[i] = a[i] * b[b_rows == 1 ? i % cols : i];
}

VGPU_KERNEL relu(long long lo, long long hi, long long n, const float *x, float *out) {
	ITEM(i);
	float v = x[i];
	out[i] = (v > 0 || v != v) ? v : 0.0f;
}

VGPU_KERNEL silu(long long lo, long long hi, long long n, const float *x, float *out) {
	ITEM(i);
	double v = x[i];
	out[i] = (float)(v / (1 + exp(-v)));
}

VGPU_KERNEL gelu(long long lo, long long hi, long long n, long long approximate, const float *x, float *out) {
	ITEM(i);
	double v = x[i];
	if (approximate == 0) {
		out[i] = (float)(0.5 * v * (1 + erf(v * 0.70710678118654752440)));
		return;
	}
	double u = 0.79788456080286535588 * (v + 0.044715 * (v * v * v));
	out[i] = (float)(v / (1 + exp(-2 * u)));
}
