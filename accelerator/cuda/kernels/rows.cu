// softmax, layer_norm, rms_norm, argmax: one item per row, in float64 like
// the references.

VGPU_KERNEL softmax(long long lo, long long hi, long long rows, long long cols, long long q, long long causal,
		    long long offset, float scale, const float *x, float *out) {
	ITEM(r);
	const float *xr = x + r * cols;
	float *o = out + r * cols;
	long long keep = cols;
	if (causal) {
		long long last = r % q + offset;
		keep = last + 1 < cols ? last + 1 : cols;
	}
	double m = 0;
	int bad = 0;
	for (long long j = 0; j < keep; j++) {
		double y = (double)scale * xr[j];
		if (y != y || y - y != 0)
			bad = 1; /* NaN or infinity: the row is NaN */
		if (j == 0 || y > m)
			m = y;
	}
	double s = 0;
	for (long long j = 0; j < keep; j++)
		s += exp((double)scale * xr[j] - m);
	for (long long j = 0; j < cols; j++) {
		if (j >= keep)
			o[j] = 0;
		else if (bad)
			o[j] = __int_as_float(0x7fc00000);
		else
			o[j] = (float)(exp((double)scale * xr[j] - m) / s);
	}
}

VGPU_KERNEL layer_norm(long long lo, long long hi, long long rows, long long cols, float eps, const float *x,
		       const float *gamma, const float *beta, float *out) {
	ITEM(r);
	const float *xr = x + r * cols;
	double mu = 0, v = 0;
	for (long long j = 0; j < cols; j++)
		mu += xr[j];
	mu /= cols;
	for (long long j = 0; j < cols; j++) {
		double d = xr[j] - mu;
		v += d * d;
	}
	v /= cols;
	double sd = sqrt(v + eps);
	for (long long j = 0; j < cols; j++)
		out[r * cols + j] = (float)((xr[j] - mu) / sd * gamma[j] + beta[j]);
}

VGPU_KERNEL rms_norm(long long lo, long long hi, long long rows, long long cols, float eps, const float *x,
		     const float *gamma, float *out) {
	ITEM(r);
	const float *xr = x + r * cols;
	double ms = 0;
	for (long long j = 0; j < cols; j++)
		ms += (double)xr[j] * xr[j];
	ms /= cols;
	double d = sqrt(ms + eps);
	for (long long j = 0; j < cols; j++)
		out[r * cols + j] = (float)(xr[j] / d * gamma[j]);
}

VGPU_KERNEL argmax(long long lo, long long hi, long long rows, long long cols, const float *x, int *out) {
	ITEM(r);
	const float *xr = x + r * cols;
	long long best = 0;
	float bv = xr[0];
	for (long long j = 1; j < cols && bv == bv; j++) {
		float v = xr[j];
		if (v != v || v > bv) {
			best = j;
			bv = v;
		}
	}
	out[r] = (int)best;
}
