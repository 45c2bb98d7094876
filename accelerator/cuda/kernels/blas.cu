// fill_f32, saxpy, reduce_sum_f32, sgemm, matmul.

// Items: elements of x.
VGPU_KERNEL fill_f32(long long lo, long long hi, float *x, long long n, float value) {
	ITEM(i);
	x[i] = value;
}

// Items: elements of y. x may be exactly y.
VGPU_KERNEL saxpy(long long lo, long long hi, long long n, float a, const float *x, float *y) {
	ITEM(i);
	float p = a * x[i];
	y[i] = p + y[i];
}

// Items: elements of x (one, if n = 0). One thread a slice, which carries
// the float64 sum in index order through acc from slice to slice
// (launch.go's carried) and writes it, rounded once, at the end.
VGPU_KERNEL reduce_sum_f32(long long lo, long long hi, long long n, const float *x, float *out, double *acc) {
	ITEM(i);
	if (i != lo)
		return;
	double s = lo == 0 ? 0 : *acc;
	for (long long j = lo; j < hi && j < n; j++)
		s += (double)x[j];
	*acc = s;
	if (hi >= n)
		out[0] = (float)s;
}

// Items: elements of c, row-major.
VGPU_KERNEL sgemm(long long lo, long long hi, long long m, long long n, long long k, float alpha, const float *a,
		  const float *b, float beta, float *c) {
	ITEM(i);
	long long r = i / n, col = i % n;
	float acc = beta == 0 ? 0.0f : beta * c[i];
	if (alpha != 0)
		for (long long p = 0; p < k; p++) {
			float x = alpha * a[r * k + p];
			acc = acc + x * b[p * n + col];
		}
	c[i] = acc;
}

// matmul's tile: each thread computes TM x TN elements of c, so that an
// element of a or b it reads serves TN or TM products (registers in place
// of the shared memory the kernels do without, common.cuh).
#define MATMUL_TM 4
#define MATMUL_TN 4

// Items: tiles of c (MATMUL_TM x MATMUL_TN, fewer at its edges), batch by
// batch, row-major. Each element sums its k products in p order from 0,
// as the reference's.
VGPU_KERNEL matmul(long long lo, long long hi, long long batch, long long m, long long n, long long k, long long trans_a,
		   long long trans_b, long long b_batch, const float *a, const float *b, float *c) {
	ITEM(i);
	long long tm = (m + MATMUL_TM - 1) / MATMUL_TM, tn = (n + MATMUL_TN - 1) / MATMUL_TN;
	long long bi = i / (tm * tn), r0 = i / tn % tm * MATMUL_TM, c0 = i % tn * MATMUL_TN;
	const float *ai = a + bi * m * k;
	const float *bb = b + (b_batch == 1 ? 0 : bi) * k * n;
	float acc[MATMUL_TM][MATMUL_TN];
	for (int u = 0; u < MATMUL_TM; u++)
		for (int v = 0; v < MATMUL_TN; v++)
			acc[u][v] = 0;
	for (long long p = 0; p < k; p++) {
		float x[MATMUL_TM], y[MATMUL_TN];
		for (int u = 0; u < MATMUL_TM; u++) {
			long long r = r0 + u < m ? r0 + u : m - 1; /* a row past the edge: read, never stored */
			x[u] = trans_a ? ai[p * m + r] : ai[r * k + p];
		}
		for (int v = 0; v < MATMUL_TN; v++) {
			long long col = c0 + v < n ? c0 + v : n - 1;
			y[v] = trans_b ? bb[col * k + p] : bb[p * n + col];
		}
		for (int u = 0; u < MATMUL_TM; u++)
			for (int v = 0; v < MATMUL_TN; v++)
				acc[u][v] = acc[u][v] + x[u] * y[v];
	}
	for (int u = 0; u < MATMUL_TM && r0 + u < m; u++)
		for (int v = 0; v < MATMUL_TN && c0 + v < n; v++)
			c[(bi * m + r0 + u) * n + c0 + v] = acc[u][v];
}
