// Command etcd is etcd's own server entry point (etcdmain.Main, as the
// etcd command of go.etcd.io/etcd/v3 calls it), built from the pinned
// go.etcd.io/etcd/server/v3 module for the cluster specs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
