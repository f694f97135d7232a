package sluice

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/sluicehq/sluice/internal/report"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "zones | inspect <zone> <key> | reset <zone> <key> | grant <zone> <key> <units> | report --metrics <url> | simulate|recommend --config <file> --log <access.log>",
		Short: "Shows and changes the rate limits of a running Caddy",
		Long: `
Talks to the rate_limit admin API of a running Caddy (/rate_limit/ on its
admin endpoint), as "caddy reload" talks to /load: the address comes from
--address, else from the admin option of --config, else the default
localhost:2019.

  zones                       every zone and scope: rate, algorithm,
                              backend, keys tracked, requests and denials
  inspect <zone> <key>        a key's state, without consuming anything
  reset <zone> <key>          forget a key's state: it is unblocked at once
  grant <zone> <key> <units>  give a key units back (never past its quota)
  report --metrics <url>      deny and shadow ratios per zone from a
                              Prometheus scrape, and which zones to tune
                              or are ready to enforce
  simulate --config <file> --log <access.log>
                              decides a JSON access log again through the
                              config's zones, offline: what each zone would
                              deny, keys, the worst minute
  recommend --config <file> --log <access.log>
                              measures each key's rate in the log and
                              proposes limits, with what each would deny

<key> is the raw identifier as a request carries it (an address, an email),
made into the key the way the zone makes it (prefixes, normalizers, hash);
with --final, the key as stored; with --missing (and no <key>), the bucket
that the zone's requests without a usable key share. Without --scope, a key
command applies to every limit of the zone that counts the zone's key.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().String("address", "", "Address of the administration endpoint")
			cmd.PersistentFlags().StringP("config", "c", "", "Configuration file to read the admin address from")
			cmd.PersistentFlags().StringP("adapter", "a", "", "Name of the config adapter to apply")
			cmd.PersistentFlags().Bool("json", false, "Print the API's JSON answer as it is")
			sub := func(name, use, short string, args int, run func(f caddycmd.Flags, args []string) error) *cobra.Command {
				c := &cobra.Command{
					Use: name + " " + use, Short: short,
					Args: func(c *cobra.Command, a []string) error {
						if m, _ := c.Flags().GetBool("missing"); m {
							return cobra.ExactArgs(args-1)(c, a) // no key
						}
						return cobra.ExactArgs(args)(c, a)
					},
					RunE: func(c *cobra.Command, args []string) error {
						c.SilenceUsage = true
						return run(caddycmd.Flags{FlagSet: c.Flags()}, args)
					},
				}
				if args >= 2 {
					c.Flags().String("scope", "", "Only this scope of the zone (\"\" is the zone's own limit)")
					c.Flags().Bool("final", false, "The key is given as stored (normalized and hashed)")
					c.Flags().Bool("missing", false, "Instead of a key, the bucket that requests without a usable key share (give no <key>)")
				}
				cmd.AddCommand(c)
				return c
			}
			sub("zones", "", "Lists every zone and scope", 0, func(f caddycmd.Flags, _ []string) error {
				return rateLimitCall(os.Stdout, f, http.MethodGet, "zones", nil)
			})
			sub("inspect", "<zone> <key>", "Shows a key's state without consuming", 2, func(f caddycmd.Flags, a []string) error {
				return rateLimitCall(os.Stdout, f, http.MethodGet, targetPath(f, a), nil)
			})
			sub("reset", "<zone> <key>", "Forgets a key's state: unblocks it at once", 2, func(f caddycmd.Flags, a []string) error {
				return rateLimitCall(os.Stdout, f, http.MethodDelete, targetPath(f, a), nil)
			})
			sub("grant", "<zone> <key> <units>", "Gives a key units back", 3, func(f caddycmd.Flags, a []string) error {
				return rateLimitCall(os.Stdout, f, http.MethodPost, targetPath(f, a)+"/grant", url.Values{"units": {a[len(a)-1]}})
			})
			report := sub("report", "--metrics <url>", "Deny and shadow ratios per zone, and what to tune or enforce", 0, func(f caddycmd.Flags, _ []string) error {
				return runReport(os.Stdout, f)
			})
			report.Flags().String("metrics", "", "Prometheus metrics of Caddy: a URL (http://localhost:2019/metrics) or a file of a scrape")
			report.Flags().Duration("min-age", 7*24*time.Hour, "How long a shadow zone must have been counted before it may be called ready")
			_ = report.MarkFlagRequired("metrics")
			addReplayCommands(cmd)
		},
	})
}

// targetPath is the API path of what a key command names: a[0] is the
// zone, a[1] the key unless --missing names the keyless bucket instead.
func targetPath(f caddycmd.Flags, a []string) string {
	if f.Bool("missing") {
		return "zones/" + pathSegment(a[0]) + "/missing"
	}
	return keyPath(a[0], a[1])
}

func keyPath(zone, key string) string {
	return "zones/" + pathSegment(zone) + "/keys/" + pathSegment(key)
}

// pathSegment escapes s as one path segment. A segment "." or ".." is
// escaped too: as it is, the client or the server's mux would resolve it
// away and ask for another endpoint.
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// adminAddress is the admin endpoint to talk to: --address, else the admin
// option of --config, else Caddy's default. The config is adapted here
// rather than by caddycmd.LoadConfig, which logs its progress at info level
// on stderr ("using config from file", "adapted config to JSON"): a
// command whose output is read by people and scripts keeps to its answer.
func adminAddress(f caddycmd.Flags) (string, error) {
	file := f.String("config")
	if f.String("address") != "" || file == "" {
		return caddycmd.DetermineAdminAPIAddress(f.String("address"), nil, "", "")
	}
	cfg, err := adaptQuietly(file, f.String("adapter"))
	if err != nil {
		return "", err
	}
	return caddycmd.DetermineAdminAPIAddress("", cfg, file, f.String("adapter"))
}

// adaptQuietly reads file as Caddy JSON, or through adapter (named, or
// chosen from the file's name as caddy's commands choose it: a name
// starting with "Caddyfile" or ending in ".caddyfile", or an extension
// that names an adapter), and returns the JSON. Its warnings are dropped:
// the command only wants the admin address.
func adaptQuietly(file, adapter string) ([]byte, error) {
	body, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the config: %v", err)
	}
	adapter = chooseAdapter(file, adapter)
	if adapter == "" {
		return body, nil
	}
	a := caddyconfig.GetAdapter(adapter)
	if a == nil {
		return nil, fmt.Errorf("unrecognized config adapter %q", adapter)
	}
	cfg, _, err := a.Adapt(body, map[string]any{"filename": file})
	if err != nil {
		return nil, fmt.Errorf("adapting the config with %s: %v", adapter, err)
	}
	return cfg, nil
}

// chooseAdapter is the adapter of file: the one named, else the one its
// name implies ("" for JSON).
func chooseAdapter(file, adapter string) string {
	if adapter != "" {
		return adapter
	}
	base := strings.ToLower(filepath.Base(file))
	ext := strings.TrimPrefix(filepath.Ext(base), ".")
	switch {
	case strings.HasPrefix(base, "caddyfile") || ext == "caddyfile":
		return "caddyfile"
	case ext != "" && ext != "json" && caddyconfig.GetAdapter(ext) != nil:
		return ext
	}
	return ""
}

// rateLimitCall sends one admin API request and prints the answer.
func rateLimitCall(w io.Writer, f caddycmd.Flags, method, path string, q url.Values) error {
	addr, err := adminAddress(f)
	if err != nil {
		return fmt.Errorf("finding the admin address: %v", err)
	}
	if q == nil {
		q = url.Values{}
	}
	if f.Lookup("scope") != nil && f.Changed("scope") {
		q.Set("scope", f.String("scope"))
	}
	if f.Lookup("final") != nil && f.Bool("final") {
		q.Set("form", "final")
	}
	uri := adminPrefix + path
	if len(q) > 0 {
		uri += "?" + q.Encode()
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, uri, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if f.Bool("json") {
		_, err = w.Write(body)
		return err
	}
	if path == "zones" {
		var v struct{ Zones []zoneInfo }
		if err := json.Unmarshal(body, &v); err != nil {
			return fmt.Errorf("reading the answer: %v", err)
		}
		return printZones(w, v.Zones)
	}
	var v struct{ Limits []keyState }
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("reading the answer: %v", err)
	}
	return printStates(w, v.Limits)
}

func printZones(w io.Writer, zones []zoneInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSCOPE\tRATE\tALGORITHM\tBACKEND\tKEYS\tREQUESTS\tDENIED\tSHADOW DENIED")
	for _, z := range zones {
		for _, l := range z.Limits {
			rate := fmt.Sprintf("%d/%s", l.MaxEvents, l.Window)
			if l.Burst > 0 {
				rate += fmt.Sprintf(" burst %d", l.Burst)
			}
			rate = limitText(rate, l)
			keys := "-"
			if l.Keys != nil {
				keys = strconv.FormatInt(*l.Keys, 10)
			}
			name := z.Name
			if z.Shadow {
				name += " (shadow)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\n", name, orDash(l.Scope), rate, l.Algorithm, z.Backend, keys, l.Requests, l.Declined, l.ShadowDeclined)
		}
	}
	return tw.Flush()
}

func printStates(w io.Writer, states []keyState) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSCOPE\tKEY\tREMAINING\tRESET IN\tRETRY IN")
	for _, s := range states {
		retry := "now"
		switch {
		case s.RetryAfter < 0:
			retry = "never"
		case s.RetryAfter > 0:
			retry = secondsText(s.RetryAfter)
		}
		if s.LockedOut > 0 {
			retry += fmt.Sprintf(" (locked out, level %d)", s.LockoutLevel)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d of %d\t%s\t%s\n", s.Zone, orDash(s.Scope), s.Key, s.Remaining, s.Limit, secondsText(s.ResetAfter), retry)
	}
	return tw.Flush()
}

func secondsText(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readMetrics reads a Prometheus scrape from a URL or a file.
func readMetrics(src string) ([]byte, error) {
	if !strings.HasPrefix(src, "http://") && !strings.HasPrefix(src, "https://") {
		return os.ReadFile(src)
	}
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(src)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", src, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 256<<20))
}

// runReport prints the report of a scrape. Which zones are shadow zones
// comes from the admin API: at --address or --config's, else at the host
// of a metrics URL (Caddy serves /metrics on its admin endpoint).
func runReport(w io.Writer, f caddycmd.Flags) error {
	src := f.String("metrics")
	scrape, err := readMetrics(src)
	if err != nil {
		return fmt.Errorf("reading the metrics: %v", err)
	}
	rows, start, err := report.Parse(scrape)
	if err != nil {
		return err
	}
	addr := f.String("address")
	if addr == "" && f.String("config") != "" {
		if addr, err = adminAddress(f); err != nil {
			return fmt.Errorf("finding the admin address: %v", err)
		}
	}
	if u, err := url.Parse(src); addr == "" && err == nil && u.Host != "" {
		addr = u.Host
	}
	return report.Write(w, rows, shadowZones(addr), start, time.Now(), f.Duration("min-age"))
}

// shadowZones asks the admin API at addr which zones are shadow zones; nil
// when it cannot tell.
func shadowZones(addr string) map[string]bool {
	if addr == "" {
		return nil
	}
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodGet, adminPrefix+"zones", nil, nil)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var v struct{ Zones []zoneInfo }
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return nil
	}
	shadow := map[string]bool{}
	for _, z := range v.Zones {
		shadow[z.Name] = z.Shadow
	}
	return shadow
}
