// attention: one item per element of out (head, query, column), which
// computes its query's scores itself, in float64 like the reference.

VGPU_KERNEL attention(long long lo, long long hi, long long heads, long long t, long long d, long long cap,
		      long long pos, long long causal, float scale, const float *q, const float *k, const float *v,
		      float *out) {
	ITEM(i);
	long long h = i / (t * d), qi = i / d % t, c = i % d;
	long long keys = causal ? pos + qi + 1 : pos + t;
	const float *qr = q + (h * t + qi) * d;
	const float *kh = k + h * cap * d, *vh = v + h * cap * d;
	double m = 0;
	for (long long j = 0; j < keys; j++) {
		double s = 0;
		for (long long e = 0; e < d; e++)
			s += (double)qr[e] * kh[j * d + e];
		s *= scale;
		if (j == 0 || s > m)
			m = s;
	}
	double sum = 0, acc = 0;
	for (long long j = 0; j < keys; j++) {
		double s = 0;
		for (long long e = 0; e < d; e++)
			s += (double)qr[e] * kh[j * d + e];
		double w = exp(s * scale - m);
		sum += w;
		acc += w * vh[j * d + c];
	}
	out[i] = (float)(acc / sum);
}
