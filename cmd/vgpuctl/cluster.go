package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/cluster"
	"github.com/vgpu/vgpu/isolation"
)

// Cluster mode's parts of vgpuctl: the cluster section of status, and
// tenants apply, which stores a quota file in etcd for every mediator.

// tenantsApplyFlags is the flag set of vgpuctl tenants apply.
func tenantsApplyFlags() (*flag.FlagSet, *etcdFlags) {
	fs := flag.NewFlagSet("tenants apply", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs, &etcdFlags{
		endpoints: fs.String("etcd", os.Getenv("VGPU_ETCD"), "etcd endpoints of the cluster, comma-separated (default $VGPU_ETCD)"),
		cert:      fs.String("etcd-cert", "", "client certificate (PEM) where etcd requires one; with --etcd-key and --etcd-ca"),
		key:       fs.String("etcd-key", "", "its private key (PEM)"),
		ca:        fs.String("etcd-ca", "", "the CA (PEM) that signed etcd's serving certificate, for https endpoints"),
	}
}

// etcdFlags say how vgpuctl reaches etcd.
type etcdFlags struct{ endpoints, cert, key, ca *string }

// tenantsApply validates the quota file and stores it in etcd, where every
// mediator started with --etcd reloads it. An invalid file is refused with
// every mistake it has, and changes nothing.
func tenantsApply(args []string) error {
	fs, ef := tenantsApplyFlags()
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("tenants apply: want one quota file, got %d arguments: %w", fs.NArg(), api.ErrInvalidArgument)
	}
	if *ef.endpoints == "" {
		return fmt.Errorf("tenants apply: no etcd endpoints (--etcd or $VGPU_ETCD): %w", api.ErrInvalidArgument)
	}
	path := fs.Arg(0)
	// Load first: it reads only a regular file of bounded size, and its
	// errors name the file.
	if _, err := isolation.Load(path); err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("tenants apply: %v: %w", err, api.ErrInvalidArgument)
	}
	endpoints, err := cluster.ParseEndpoints(*ef.endpoints)
	if err != nil {
		return err
	}
	tlsCfg, err := cluster.TLSFiles(*ef.cert, *ef.key, *ef.ca)
	if err != nil {
		return err
	}
	s, err := cluster.Connect(cluster.Options{Endpoints: endpoints, TLS: tlsCfg})
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), s.Options().OpTimeout)
	defer cancel()
	cfg, err := s.PutTenants(ctx, data)
	if err != nil {
		return err
	}
	fmt.Printf("%s stored in etcd (%d tenants); mediators with --etcd use it now\n", path, len(cfg.Tenants))
	return nil
}

// renderCluster writes the cluster section of vgpuctl status: the nodes
// and mediators registered in etcd and each tenant's use over all
// mediators. Nothing outside cluster mode.
func renderCluster(out io.Writer, c *api.ClusterStatus) error {
	if c == nil {
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\ncluster (this mediator: %s)\n", c.ID)
	if c.Error != "" {
		fmt.Fprintf(w, "etcd cannot be read: %s\n", c.Error)
		return w.Flush()
	}
	fmt.Fprintln(w, "NODE\tBACKEND\tDEVICES\tMEMORY\tFREE\tCONNECTIONS\tUSED HERE")
	for _, n := range c.Nodes {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%s\n", n.Addr, n.Backend, n.Devices, api.FormatSize(n.Memory), api.FormatSize(n.Free), n.Connections, yesNo(n.Connected))
	}
	fmt.Fprintln(w, "\nMEDIATOR\tHOST\tSTARTED")
	for _, m := range c.Mediators {
		fmt.Fprintf(w, "%s\t%s\t%s\n", m.ID, m.Host, m.Started.Format("2006-01-02 15:04:05Z"))
	}
	fmt.Fprintln(w, "\nTENANT\tRESERVED CLUSTER-WIDE\tCONTAINERS")
	if len(c.Tenants) == 0 {
		fmt.Fprintln(w, "(none)")
	}
	for _, t := range c.Tenants {
		fmt.Fprintf(w, "%s\t%s\t%d\n", t.Name, api.FormatSize(t.Reserved), t.Containers)
	}
	return w.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// tenantsSubFlags is the flag set of vgpuctl tenants or of a subcommand, for help.
func tenantsSubFlags(sub string) *flag.FlagSet {
	if sub == "apply" {
		fs, _ := tenantsApplyFlags()
		return fs
	}
	fs, _ := jsonFlags("tenants")
	return fs
}

// renderClusterUse writes, after vgpuctl tenants' table, each tenant's use
// over all mediators (cluster mode); nothing where no tenant carries it.
func renderClusterUse(out io.Writer, ts []api.TenantInfo) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := false
	for _, t := range ts {
		if t.Cluster == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nTENANT\tRESERVED CLUSTER-WIDE\tCONTAINERS CLUSTER-WIDE")
			header = true
		}
		fmt.Fprintf(w, "%s\t%s\t%d\n", t.Name, api.FormatSize(t.Cluster.Reserved), t.Cluster.Containers)
	}
	return w.Flush()
}
