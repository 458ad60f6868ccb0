module github.com/keygate/keygate/gatewayauth

go 1.22
