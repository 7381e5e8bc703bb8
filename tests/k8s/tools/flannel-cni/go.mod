// Builds flannel's CNI plugin from the Go module proxy. The proxy refuses its own module
// (github.com/flannel-io/cni-plugin, 403 for every version), so this is the same plugin from its
// previous home, the reference plugins' meta/flannel (removed from them after v0.9.1).
module ipkeep.dev/tools/flannel-cni

go 1.26.8

tool github.com/containernetworking/plugins/plugins/meta/flannel

require (
	github.com/Microsoft/go-winio v0.4.11 // indirect
	github.com/Microsoft/hcsshim v0.8.6 // indirect
	github.com/buger/jsonparser v0.0.0-20180808090653-f4dd9f5a6b44 // indirect
	github.com/containernetworking/cni v0.8.1 // indirect
	github.com/containernetworking/plugins v0.9.1 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	golang.org/x/crypto v0.0.0-20200622213623-75b288015ac9 // indirect
	golang.org/x/sys v0.0.0-20201117170446-d9b008d0a637 // indirect
)
