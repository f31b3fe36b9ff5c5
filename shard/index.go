package shard

// Index maps a key to one of n shards with a stable hash (same on every node and release).
//
// The hash is 64-bit FNV-1a, reduced mod n. A cluster's data is placed by it: changing the
// hash (or n) moves keys to other shards, so it is a breaking change for cluster
// deployments and needs a migration. n < 1 is treated as 1. It takes a string as well, so
// that the client spreads keys over its connections with it without a conversion.
func Index[K ~string | ~[]byte](key K, n int) int {
	if n <= 1 {
		return 0
	}
	return int(Hash(key) % uint64(n))
}

// Hash is the hash Index reduces mod n: 64-bit FNV-1a of key.
func Hash[K ~string | ~[]byte](key K) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return h
}
