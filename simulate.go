package sluice

import (
	"fmt"
	"io"
	"os"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/replay"
)

// addReplayCommands adds `simulate` and `recommend` to `caddy rate-limit`:
// they decide an access log again through a config's zones, on this
// machine, with nothing running.
func addReplayCommands(cmd *cobra.Command) {
	flags := func(c *cobra.Command) {
		c.Flags().StringArray("log", nil, "Caddy JSON access log to replay (repeat for several files; gzip'd files are read too; - is standard input)")
		c.Flags().Duration("reorder", replay.DefaultReorder, "How long a request may have taken and still be replayed in its place among the others")
		c.Flags().String("server", "", "The server that replays lines whose logger names none (default: the first by name)")
		c.Flags().String("html", "", "Also write the report as one self-contained HTML page to this file")
		_ = c.MarkFlagRequired("log")
	}
	sim := &cobra.Command{
		Use:   "simulate --config <file> --log <access.log>…",
		Short: "Decides an access log again through the config's zones: what each would deny",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			c.SilenceUsage = true
			return runSimulate(os.Stdout, caddycmd.Flags{FlagSet: c.Flags()})
		},
	}
	flags(sim)
	sim.Flags().String("decisions", "", "Write each replayed request's decision to this file, one JSON object a line")
	rec := &cobra.Command{
		Use:   "recommend --config <file> --log <access.log>…",
		Short: "Measures each key's rate in an access log and proposes limits, with what each would deny",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			c.SilenceUsage = true
			return runRecommend(os.Stdout, caddycmd.Flags{FlagSet: c.Flags()})
		},
	}
	flags(rec)
	rec.Flags().String("rule", replay.DefaultRule, "How the proposed limit follows from the per-key peaks: p99x3 (three times the p99), p999 (the p99.9) or max")
	cmd.AddCommand(sim, rec)
}

// replayOptions reads the flags both commands share.
func replayOptions(f caddycmd.Flags) (*replay.Plan, replay.Options, error) {
	file := f.String("config")
	if file == "" {
		return nil, replay.Options{}, fmt.Errorf("--config is required: the config whose zones decide the log")
	}
	cfg, err := adaptQuietly(file, f.String("adapter"))
	if err != nil {
		return nil, replay.Options{}, err
	}
	plan, err := replay.PrepareConfig(cfg)
	if err != nil {
		return nil, replay.Options{}, err
	}
	source, _ := os.ReadFile(file)
	logs, _ := f.GetStringArray("log")
	return plan, replay.Options{
		Config: cfg, Logs: logs, Reorder: f.Duration("reorder"), Server: f.String("server"),
		Prepare: prepareReplay, Source: string(source), Adapter: chooseAdapter(file, f.String("adapter")),
	}, nil
}

// prepareReplay puts a rate_limit handler on the replay's clock: its own
// clock (settling, tarpit holds) reads the log's time, and its waits (a
// leaky_bucket queue, the tarpit) end at once, so nothing sleeps.
func prepareReplay(m caddyhttp.MiddlewareHandler, now func() int64) {
	h, ok := m.(*Handler)
	if !ok {
		return
	}
	h.plan.now = now
	h.plan.newTimer = firedTimer
}

// firedTimer is a timer that has already fired.
func firedTimer(time.Duration) (<-chan time.Time, func() bool) {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c, func() bool { return false }
}

func runSimulate(w io.Writer, f caddycmd.Flags) error {
	plan, opts, err := replayOptions(f)
	if err != nil {
		return err
	}
	if path := f.String("decisions"); path != "" {
		out, err := os.Create(path)
		if err != nil {
			return err
		}
		defer out.Close()
		opts.Decisions = out
	}
	html := f.String("html")
	res, err := replay.Replay(plan, plan.JSON, opts, html != "")
	if err != nil {
		return err
	}
	rep := replay.NewReport(plan, res)
	if html != "" {
		if err := writeFile(html, func(w io.Writer) error { return replay.WriteSimulateHTML(w, rep) }); err != nil {
			return err
		}
	}
	if f.Bool("json") {
		return replay.WriteJSON(w, rep)
	}
	return rep.WriteText(w)
}

func runRecommend(w io.Writer, f caddycmd.Flags) error {
	plan, opts, err := replayOptions(f)
	if err != nil {
		return err
	}
	rec, err := replay.Recommend(plan, opts, f.String("rule"))
	if err != nil {
		return err
	}
	if html := f.String("html"); html != "" {
		if err := writeFile(html, func(w io.Writer) error { return replay.WriteRecommendHTML(w, rec) }); err != nil {
			return err
		}
	}
	if f.Bool("json") {
		return replay.WriteJSON(w, rec)
	}
	return rec.WriteText(w)
}

func writeFile(path string, write func(io.Writer) error) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
