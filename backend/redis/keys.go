package redis

import (
	"fmt"
	"strings"
)

// Key layout (docs/redis.md):
//
//	<prefix><zone>/<scope>/<kind>{<key>}
//
// The zone name is escaped (%, /, { and } as %XX) so that the fields cannot
// run into each other; scope names cannot hold / or braces. The client's key
// is the hash tag: every zone and scope that limits the same key (a client
// address limited by several zones) lives in one Redis Cluster slot, and
// such a request is decided by one script call, atomically. So do the keys
// beside a state, which the script reaches from the state's key: its
// lock-out record (the kind letter replaced by kindLockout), a budget's
// reservations (the state's key and reservationsSuffix) and the key of another kind of
// state that a change of algorithm carries usage from.

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

// clientKey is the key, in the zone of zp (zonePrefix), of a client's key:
// every key Sluice writes for a client is made here. A key that is empty
// (the quota of requests that lack theirs) or starts with } would make an
// empty hash tag: Redis would hash each name whole, and a state and the
// keys beside it would land in different cluster slots, which one script
// cannot touch together. Such a key, and one starting with NUL (so that no
// two keys meet), is written after a NUL: its tag is "\x00", the same for
// all of its keys.
func clientKey(zp, key string) string {
	if key == "" || key[0] == '}' || key[0] == 0 {
		return zp + "\x00" + key + "}"
	}
	return zp + key + "}"
}

// stateKey is the key of key's state in z.
func (z *zone) stateKey(key string) string { return clientKey(z.prefix, key) }

// reservationsKey is the key of the open reservations of a spend budget
// whose state is at state (the script builds it the same way).
func reservationsKey(state string) string { return state + reservationsSuffix }

// checkKeyPrefix refuses a prefix that would break the hash tags: a { in
// it starts the tag, which must then close within the prefix around
// something, or the keys of one client would not share a cluster slot.
func checkKeyPrefix(prefix string) error {
	i := strings.IndexByte(prefix, '{')
	if i < 0 {
		return nil
	}
	if j := strings.IndexByte(prefix[i+1:], '}'); j <= 0 {
		return fmt.Errorf("key_prefix %q: a { starts the hash tag of every key and must be closed by a } within the prefix, around at least one character (sluice{1}:), or the keys of one client would land in different Redis Cluster slots", prefix)
	}
	return nil
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
