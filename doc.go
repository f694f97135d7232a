// Package sluice is a rate limiter for Caddy: the http.handlers.rate_limit module.
package sluice
