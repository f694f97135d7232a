package redis

import "strings"

// Key layout (docs/redis.md):
//
//	<prefix><zone>/<scope>/<kind>{<key>}
//
// The zone name is escaped (%, /, { and } as %XX) so that the fields cannot
// run into each other; scope names cannot hold / or braces. The client's key
// is the hash tag: every zone and scope that limits the same key (a client
// address limited by several zones) lives in one Redis Cluster slot, and
// such a request is decided by one script call, atomically.

// DefaultKeyPrefix starts every key Sluice writes when Options.KeyPrefix is
// empty.
const DefaultKeyPrefix = "sluice:"

func escapeZone(name string) string {
	if !strings.ContainsAny(name, "%/{}") {
		return name
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '%', '/', '{', '}':
			const hex = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// zonePrefix is the part of a state's key before the client's key.
func zonePrefix(prefix, zone, scope string, kind byte) string {
	return prefix + escapeZone(zone) + "/" + scope + "/" + string(kind) + "{"
}

// slotOf returns the Redis Cluster hash slot of key: CRC16 of the part
// between the first { and the next } when that part is not empty, else of
// the whole key.
func slotOf(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % 16384
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum
// Redis Cluster assigns slots with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
