package redistest

import (
	"context"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// The servers started are of the flavour SLUICE_REDIS_SERVER names: a
// Valkey leg that ran on Redis would prove nothing. Valkey reports
// valkey_version beside the redis_version it keeps for clients.
func TestServersAreOfTheFlavour(t *testing.T) {
	s := Standalone(t, "")
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	valkey := strings.Contains(info, "valkey_version:")
	if valkey != (Flavour() == "valkey") {
		t.Fatalf("%s=%q started a server whose INFO says valkey=%v:\n%s", FlavourEnv, Flavour(), valkey, info)
	}
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "redis_version:") || strings.HasPrefix(line, "valkey_version:") {
			t.Log(strings.TrimSpace(line))
		}
	}
}
