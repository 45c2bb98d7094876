package api

import "time"

// ClusterStatus is a mediator's view of the cluster in cluster mode
// (Status.Cluster): the registry in etcd and the tenants' reservations
// summed over every live mediator.
type ClusterStatus struct {
	ID        string            `json:"id"` // this mediator's
	Etcd      []string          `json:"etcd"`
	Nodes     []ClusterNode     `json:"nodes"`
	Mediators []ClusterMediator `json:"mediators"`
	Tenants   []ClusterTenant   `json:"tenants"`
	// Error says why etcd could not be read; the lists are then empty.
	Error string `json:"error,omitempty"`
}

// ClusterNode is a registered node.
type ClusterNode struct {
	Addr        string `json:"addr"`
	Backend     string `json:"backend"`
	TLS         string `json:"tls,omitempty"` // its certificate's subject
	Devices     int    `json:"devices"`
	Memory      uint64 `json:"memory"` // of all its devices
	Free        uint64 `json:"free"`
	Connections int    `json:"connections"`
	// Connected: the mediator reporting places on it and its connection
	// to it is up.
	Connected bool `json:"connected"`
}

// ClusterMediator is a registered mediator.
type ClusterMediator struct {
	ID      string    `json:"id"`
	Host    string    `json:"host"`
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started"`
}

// ClusterTenant is a tenant's reservations over all mediators.
type ClusterTenant struct {
	Name       string `json:"name"`
	Reserved   uint64 `json:"reserved"`
	Containers int    `json:"containers"`
}

// ClusterUse is a tenant's reservations summed over every live mediator
// (TenantInfo.Cluster, in cluster mode).
type ClusterUse struct {
	Reserved   uint64 `json:"reserved_bytes"`
	Containers int    `json:"containers"`
}
