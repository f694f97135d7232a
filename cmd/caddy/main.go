// Command caddy is Caddy with its standard modules and Sluice, for development,
// tests and the quick start. Production builds can use xcaddy instead; see README.md.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/sluicehq/sluice"
)

func main() {
	caddycmd.Main()
}
