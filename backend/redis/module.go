package redis

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
)

func init() {
	caddy.RegisterModule(new(Module))
}

// Module is the Redis backend as a Caddy module: every Caddy instance that
// names the same Redis shares the zones' state, so a limit holds for a
// fleet as a whole. It takes a standalone server (`addresses` or `url`), a
// Redis Cluster (`cluster`, with some of its nodes as seeds) or a master
// found through Sentinel (`sentinel`).
//
// Handlers, sites and configs that name the same Redis (the same
// addresses, credentials, database and TLS settings) share one connection
// pool, which is closed when the last of them is unloaded.
type Module struct {
	// Addresses are host:port of the server, or with Cluster, of some
	// nodes of the cluster (seeds). Default: localhost:6379.
	Addresses []string `json:"addresses,omitempty"`

	// URL is the server as a URL, instead of Addresses, Username,
	// Password and DB: redis://user:password@host:6379/0, or rediss:// for
	// TLS. Write secrets as {env.NAME}: they are read from the environment
	// when the config loads and never appear in the adapted JSON.
	URL string `json:"url,omitempty"`

	// Username and Password authenticate (Redis 6 ACLs; a password alone
	// for requirepass). Use {env.NAME} placeholders.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`

	// DB is the database number of a standalone or Sentinel server.
	// Default: 0. A Redis Cluster has only database 0.
	DB int `json:"db,omitempty"`

	// Cluster makes Addresses the seeds of a Redis Cluster.
	Cluster bool `json:"cluster,omitempty"`

	// Sentinel finds the master through Redis Sentinel.
	Sentinel *Sentinel `json:"sentinel,omitempty"`

	// TLS connects with TLS (a rediss:// URL does too).
	TLS *TLS `json:"tls,omitempty"`

	// KeyPrefix starts every key Sluice writes. Default: "sluice:". A {
	// in it must be closed within it around at least one character
	// ("sluice{1}:" puts every key in one Redis Cluster slot).
	KeyPrefix string `json:"key_prefix,omitempty"`

	// Timeout bounds each decision's calls to Redis. Default: 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// PoolSize is the most connections to each Redis server. Default:
	// 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// LocalCache remembers, in this process, the keys Redis declared over
	// their limit until their retry time, and denies further requests of
	// the same cost on them without asking Redis (at most
	// 10,000 keys, the oldest making room). Default: true. docs/redis.md
	// says when its answers can differ from Redis's.
	LocalCache *bool `json:"local_cache,omitempty"`

	*Store
	poolKey string
	breaker *breaker
	leases  *leaser // nil until a limit leases
}

// Sentinel names a master and the Sentinels that know it.
type Sentinel struct {
	// MasterName is the name the Sentinels monitor the master under.
	MasterName string `json:"master_name"`
	// Addresses are host:port of some of the Sentinels.
	Addresses []string `json:"addresses"`
	// Username and Password authenticate to the Sentinels, when they ask.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// TLS is how to verify the server.
type TLS struct {
	// CA is a PEM file of the certificate authorities to trust, instead of
	// the system's.
	CA string `json:"ca,omitempty"`
	// ServerName is the name to verify the server's certificate against,
	// when it is not the host of the address.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any certificate: for tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (*Module) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  backend.Namespace + ".redis",
		New: func() caddy.Module { return new(Module) },
	}
}

// clients shares connection pools between the handlers, sites and
// configs that name the same Redis.
var clients = caddy.NewUsagePool()

type sharedClient struct {
	goredis.UniversalClient
	breaker *breaker
	evict   *evictionCheck
}

func (c sharedClient) Destruct() error {
	c.evict.close()
	return c.Close()
}

// Provision makes the store over the shared connection pool. It never
// waits for Redis (`caddy validate` needs none): the pool dials for the
// first request, and the memory policy is read in the background.
func (m *Module) Provision(ctx caddy.Context) error {
	opts, err := m.clientOptions(caddy.NewReplacer())
	if err != nil {
		return err
	}
	key, err := poolKeyOf(opts, m.TLS)
	if err != nil {
		return err
	}
	v, _, err := clients.LoadOrNew(key, func() (caddy.Destructor, error) {
		c := sharedClient{UniversalClient: goredis.NewUniversalClient(opts), breaker: newBreaker(ctx.Logger(), breakerOpenFor)}
		// A Redis that comes back after an outage may be another one (a
		// restart with another config, a failover): its policy is read
		// again.
		c.evict = newEvictionCheck(c.UniversalClient, ctx.Logger())
		c.breaker.recovered = func() { c.evict.start(nil) }
		return c, nil
	})
	if err != nil {
		return err
	}
	m.poolKey = key
	m.breaker = v.(sharedClient).breaker
	// In the background: a config load never waits for Redis.
	v.(sharedClient).evict.start(ctx.Logger())
	m.Store, err = New(v.(sharedClient).UniversalClient, Options{
		KeyPrefix: m.KeyPrefix, Timeout: time.Duration(m.Timeout),
		NoCache: m.LocalCache != nil && !*m.LocalCache,
	})
	if err != nil {
		m.release()
		return err
	}
	m.Store.slots.logger = ctx.Logger()
	m.Store.drops.provision(ctx)
	return nil
}

// Close lets go of the zones and of this config's share of the pool.
func (m *Module) Close() error {
	var err error
	m.leases.close(context.Background(), viaBreaker{m})
	if m.Store != nil {
		err = m.Store.Close()
	}
	m.release()
	return err
}

func (m *Module) release() {
	if m.poolKey != "" {
		_, _ = clients.Delete(m.poolKey)
		m.poolKey = ""
	}
}

// clientOptions checks the configuration and turns it into go-redis
// options, with {env.*} placeholders replaced.
func (m *Module) clientOptions(repl *caddy.Replacer) (*goredis.UniversalOptions, error) {
	expand := func(s string) string { return repl.ReplaceAll(s, "") }
	switch {
	case m.Timeout < 0:
		return nil, fmt.Errorf("redis: timeout must be positive, got %v", time.Duration(m.Timeout))
	case m.PoolSize < 0:
		return nil, fmt.Errorf("redis: pool_size must be at least 1, got %d", m.PoolSize)
	case m.DB < 0:
		return nil, fmt.Errorf("redis: db must be 0 or more, got %d", m.DB)
	case m.Cluster && m.DB != 0:
		return nil, errors.New("redis: a Redis Cluster has only database 0: remove db")
	case m.Cluster && m.Sentinel != nil:
		return nil, errors.New("redis: use either cluster or sentinel, not both")
	case m.URL != "" && (len(m.Addresses) > 0 || m.Username != "" || m.Password != "" || m.DB != 0):
		return nil, errors.New("redis: url replaces addresses, username, password and db: give one or the other")
	case m.URL != "" && m.Sentinel != nil:
		return nil, errors.New("redis: with sentinel, give the Sentinels' addresses, not a url")
	case len(m.Addresses) > 1 && !m.Cluster:
		return nil, errors.New("redis: several addresses are the seeds of a Redis Cluster: add cluster (or use sentinel for a master and its replicas)")
	}
	if err := checkKeyPrefix(m.KeyPrefix); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	opts := &goredis.UniversalOptions{
		Addrs:                 make([]string, 0, len(m.Addresses)),
		Username:              expand(m.Username),
		Password:              expand(m.Password),
		DB:                    m.DB,
		IsClusterMode:         m.Cluster,
		PoolSize:              m.PoolSize,
		ContextTimeoutEnabled: true,
		ClientName:            "sluice",
	}
	for _, a := range m.Addresses {
		opts.Addrs = append(opts.Addrs, expand(a))
	}
	if m.URL != "" {
		if err := fromURL(opts, expand(m.URL), m.Cluster); err != nil {
			return nil, err
		}
	}
	if m.Sentinel != nil {
		if m.Sentinel.MasterName == "" || len(m.Sentinel.Addresses) == 0 {
			return nil, errors.New("redis: sentinel needs a master name and at least one Sentinel address")
		}
		if len(m.Addresses) > 0 {
			return nil, errors.New("redis: with sentinel, the Sentinels find the master: remove addresses")
		}
		opts.MasterName = m.Sentinel.MasterName
		for _, a := range m.Sentinel.Addresses {
			opts.Addrs = append(opts.Addrs, expand(a))
		}
		opts.SentinelUsername = expand(m.Sentinel.Username)
		opts.SentinelPassword = expand(m.Sentinel.Password)
	}
	if len(opts.Addrs) == 0 {
		opts.Addrs = []string{"localhost:6379"}
	}
	if m.TLS != nil {
		cfg, err := m.TLS.config()
		if err != nil {
			return nil, err
		}
		if opts.TLSConfig != nil && m.TLS.ServerName == "" {
			cfg.ServerName = opts.TLSConfig.ServerName
		}
		opts.TLSConfig = cfg
	}
	return opts, nil
}

// fromURL fills opts from a redis:// or rediss:// URL.
func fromURL(opts *goredis.UniversalOptions, url string, cluster bool) error {
	if cluster {
		c, err := goredis.ParseClusterURL(url)
		if err != nil {
			return fmt.Errorf("redis: url: %v", err)
		}
		opts.Addrs, opts.Username, opts.Password, opts.TLSConfig = c.Addrs, c.Username, c.Password, c.TLSConfig
		return nil
	}
	o, err := goredis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("redis: url: %v", err)
	}
	opts.Addrs, opts.Username, opts.Password, opts.DB, opts.TLSConfig = []string{o.Addr}, o.Username, o.Password, o.DB, o.TLSConfig
	return nil
}

func (t *TLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("redis: tls ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis: tls ca: no PEM certificate in %s", t.CA)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// poolKeyOf identifies a connection pool by everything that shapes it.
// Secrets are part of it, so it is hashed rather than kept as text.
func poolKeyOf(o *goredis.UniversalOptions, t *TLS) (string, error) {
	b, err := json.Marshal(struct {
		Addrs                            []string
		Username, Password               string
		DB                               int
		Cluster                          bool
		Master, SentinelUser, SentinelPw string
		PoolSize                         int
		TLS                              bool
		TLSConf                          *TLS
		TLSServerName                    string
	}{o.Addrs, o.Username, o.Password, o.DB, o.IsClusterMode, o.MasterName, o.SentinelUsername, o.SentinelPassword, o.PoolSize,
		o.TLSConfig != nil, t, serverName(o.TLSConfig)})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func serverName(c *tls.Config) string {
	if c == nil {
		return ""
	}
	return c.ServerName
}

// UnmarshalCaddyfile reads
//
//	backend redis {
//	    address    <host:port...>     # repeatable; with cluster, the seeds
//	    url        <redis[s]://…>     # instead of address, username, password, db
//	    username   <name>
//	    password   <secret>           # {env.NAME}
//	    db         <n>
//	    cluster
//	    sentinel   <master_name> <sentinel_address...>
//	    tls {
//	        ca                   <file>
//	        server_name          <name>
//	        insecure_skip_verify
//	    }
//	    key_prefix <prefix>
//	    timeout    <duration>
//	    pool_size  <n>
//	    local_cache on|off
//	}
func (m *Module) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		opt := d.Val()
		if seen[opt] && opt != "address" {
			return d.Errf("redis: %s given twice", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "address":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			m.Addresses = append(m.Addresses, args...)
		case "url":
			m.URL, err = oneArg(d)
		case "username":
			m.Username, err = oneArg(d)
		case "password":
			m.Password, err = oneArg(d)
		case "db":
			m.DB, err = intArg(d, opt)
		case "pool_size":
			m.PoolSize, err = intArg(d, opt)
		case "cluster":
			if d.NextArg() {
				return d.ArgErr()
			}
			m.Cluster = true
		case "sentinel":
			args := d.RemainingArgs()
			if len(args) < 2 {
				return d.Errf("redis: sentinel <master_name> <sentinel_address...>")
			}
			m.Sentinel = &Sentinel{MasterName: args[0], Addresses: args[1:]}
		case "tls":
			if d.NextArg() {
				return d.ArgErr()
			}
			m.TLS = new(TLS)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "ca":
					m.TLS.CA, err = oneArg(d)
				case "server_name":
					m.TLS.ServerName, err = oneArg(d)
				case "insecure_skip_verify":
					if d.NextArg() {
						return d.ArgErr()
					}
					m.TLS.InsecureSkipVerify = true
				default:
					return d.Errf("redis: unrecognized tls option %q", d.Val())
				}
				if err != nil {
					return err
				}
			}
		case "key_prefix":
			m.KeyPrefix, err = oneArg(d)
		case "local_cache":
			var v string
			if v, err = oneArg(d); err == nil {
				if v != "on" && v != "off" {
					return d.Errf("redis: local_cache must be on or off, got %q", v)
				}
				on := v == "on"
				m.LocalCache = &on
			}
		case "timeout":
			var v string
			if v, err = oneArg(d); err == nil {
				var dur time.Duration
				dur, err = caddy.ParseDuration(v)
				if err != nil || dur <= 0 {
					return d.Errf("redis: invalid timeout %q: want a positive duration, such as 50ms", v)
				}
				m.Timeout = caddy.Duration(dur)
			}
		default:
			return d.Errf("redis: unrecognized option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func oneArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

func intArg(d *caddyfile.Dispenser, opt string) (int, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, d.Errf("redis: %s must be a whole number ≥ 0, got %q", opt, v)
	}
	return n, nil
}

// Interface guards.
var (
	_ caddy.Provisioner     = (*Module)(nil)
	_ backend.Store         = (*Module)(nil)
	_ caddyfile.Unmarshaler = (*Module)(nil)
)
