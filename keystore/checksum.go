package keystore

import "hash/crc32"

// base62 is the alphabet of a key's checksum, digit values 0 to 61 in order.
const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// crcTable is the IEEE CRC-32 table (hash/crc32's ChecksumIEEE).
var crcTable = crc32.MakeTable(crc32.IEEE)

// Checksum returns the checksum that ends a key's secret. body is everything before
// the checksum in the full key: <prefix>_live_<keyId>.<43 base64url characters>. The
// checksum is the CRC-32 of body (IEEE, as hash/crc32's ChecksumIEEE). It is written
// in base62 with the alphabet 0-9A-Za-z, most significant digit first. It is
// left-padded with '0' to ChecksumLen (6) characters. 62^6 > 2^32, so six digits
// always suffice, and the first is at most '4'.
func Checksum(body string) string {
	var out [ChecksumLen]byte
	encodeBase62(&out, crcString(body))
	return string(out[:])
}

// checksumMatches reports whether sum is Checksum(body), without allocating.
func checksumMatches(body, sum string) bool {
	var want [ChecksumLen]byte
	encodeBase62(&want, crcString(body))
	// Anyone can compute the checksum from the key itself. It is no secret, and needs
	// no constant-time compare.
	return sum == string(want[:])
}

// crcString is crc32.ChecksumIEEE(s) over a string's bytes, one byte at a time from
// the table. A key is at most 136 bytes. Converting it to a []byte for hash/crc32
// would allocate.
func crcString(s string) uint32 {
	crc := ^uint32(0)
	for i := 0; i < len(s); i++ {
		crc = crcTable[byte(crc)^s[i]] ^ (crc >> 8)
	}
	return ^crc
}

// encodeBase62 writes v in base62, most significant digit first, fixed width.
func encodeBase62(out *[ChecksumLen]byte, v uint32) {
	for i := ChecksumLen - 1; i >= 0; i-- {
		out[i] = base62[v%62]
		v /= 62
	}
}
