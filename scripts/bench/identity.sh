# shellcheck shell=bash
# bench/identity.sh: (i), the cost of signed identity: the gateway with identity_key
# and with gateway_secret alone, a pair of sites (bench_pair, pair.sh): what signing
# X-Gateway-Identity costs (the upstream checks the shared secret in both; verifying the
# assertion is the upstream's cost, not the gateway's). BENCH_IDENTITY=0 skips it.
bench_identity() {
	openssl genpkey -algorithm ed25519 -out "$stack/identity.pem"
	bench_pair identity_report "(i) signed identity" "A: gateway, identity_key" "identity_key $stack/identity.pem" \
		"B: gateway, gateway_secret alone" ""
}
