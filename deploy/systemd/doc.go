// Package systemd holds keygate's systemd units: keygate-gateway.service (Caddy with
// the module), keygate-upstream.service, the users they run as (keygate.sysusers) and
// examples of their environment files. docs/operations.md says how to install them;
// the package's test checks them with systemd-analyze.
package systemd
