// Command tenantdial opens a session as a tenant and says how that went,
// for the end-to-end tests of who may act as which tenant on the host
// socket, which run it as unprivileged uids. Its exit status carries the
// error's type, which a message alone would not: EACCES from connect reads
// "permission denied" too.
//
// usage: tenantdial --socket PATH --tenant NAME
//
// It prints "ok" and exits 0 if the session opened; otherwise it prints the
// error and exits 3 for api.ErrPermissionDenied, 4 for api.ErrUnavailable
// (no connection: the socket's mode, say) and 1 for anything else.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

func main() {
	socket := flag.String("socket", "", "mediator socket")
	tenant := flag.String("tenant", "", "tenant name")
	flag.Parse()
	c, err := client.Dial(client.Options{Socket: *socket, Tenant: *tenant})
	if err == nil {
		c.Close()
		fmt.Println("ok")
		return
	}
	fmt.Println(err)
	switch {
	case errors.Is(err, api.ErrPermissionDenied):
		os.Exit(3)
	case errors.Is(err, api.ErrUnavailable):
		os.Exit(4)
	}
	os.Exit(1)
}
