// embedding_bag_sum, embedding: gathers of table rows by int32 index. An
// index outside the table (rewritten by the tenant after the node checked
// it) reads as a row of zeros rather than outside the buffer.

// Items: elements of out (bag, column).
VGPU_KERNEL embedding_bag_sum(long long lo, long long hi, const float *table, long long rows, long long dim,
			      const int *indices, long long nidx, const int *offsets, long long nbags, float *out) {
	ITEM(i);
	long long b = i / dim, c = i % dim;
	long long start = offsets[b], end = b + 1 < nbags ? offsets[b + 1] : nidx;
	if (start < 0)
		start = 0;
	if (end > nidx)
		end = nidx;
	float acc = 0;
	for (long long p = start; p < end; p++) {
		long long row = indices[p];
		if (row >= 0 && row < rows)
			acc = acc + table[row * dim + c];
	}
	out[i] = acc;
}

// Items: elements of out (id, column).
VGPU_KERNEL embedding(long long lo, long long hi, long long n, long long vocab, long long dim, const int *ids,
		      const float *table, float *out) {
	ITEM(i);
	long long id = ids[i / dim];
	out[i] = id >= 0 && id < vocab ? table[id * dim + i % dim] : 0.0f;
}
