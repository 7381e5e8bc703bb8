// Package e2e is Kubernetes' e2e.test restricted to the test packages scripts/conformance.sh
// runs (sig-apps, sig-network and the common network checks), so the binary builds in a fraction
// of the full suite's time. TestMain follows k8s.io/kubernetes/test/e2e/e2e_test.go of the same
// release: the flags, the embedded manifests, then the suite. One flag is ours:
// --namespace-label KEY=VALUE labels every test namespace before the test's own set-up runs.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// Constants the test packages rely on being defined and frozen.
	_ "k8s.io/kubernetes/test/e2e/feature"

	// The tests.
	_ "k8s.io/kubernetes/test/e2e/apps"
	_ "k8s.io/kubernetes/test/e2e/common/network" // Networking Granular Checks
	_ "k8s.io/kubernetes/test/e2e/network"

	// The framework's hooks (debug dumps on failure, metrics, node checks), as upstream wires them.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

// namespaceLabels are the --namespace-label flags: KEY=VALUE pairs.
type namespaceLabels map[string]string

func (l namespaceLabels) String() string { return fmt.Sprint(map[string]string(l)) }

func (l namespaceLabels) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	l[k] = val
	return nil
}

var extraLabels = namespaceLabels{}

// The framework creates each test's namespace itself, with a random name, and has no option for
// labels of one's own. An extension's BeforeEach runs right after the framework's (which creates
// the namespace) and before any BeforeEach or It of the test, so every object the test creates,
// StatefulSets included, is created in a namespace that already has the labels.
func init() {
	framework.NewFrameworkExtensions = append(framework.NewFrameworkExtensions, func(f *framework.Framework) {
		ginkgo.BeforeEach(func(ctx context.Context) {
			if len(extraLabels) == 0 || f.Namespace == nil {
				return
			}
			patch := `{"metadata":{"labels":{`
			first := true
			for k, v := range extraLabels {
				if !first {
					patch += ","
				}
				first = false
				patch += fmt.Sprintf("%q:%q", k, v)
			}
			patch += "}}}"
			_, err := f.ClientSet.CoreV1().Namespaces().Patch(ctx, f.Namespace.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			framework.ExpectNoError(err, "labelling namespace %s with %v (--namespace-label)", f.Namespace.Name, extraLabels)
			framework.Logf("labelled namespace %s with %v (--namespace-label)", f.Namespace.Name, extraLabels)
		})
	})
}

func TestMain(m *testing.M) {
	var versionFlag bool
	flag.CommandLine.BoolVar(&versionFlag, "version", false, "Displays version information.")
	flag.CommandLine.Var(extraLabels, "namespace-label", "KEY=VALUE: a label every test namespace gets before the test's own set-up (repeatable).")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if versionFlag {
		fmt.Printf("%s\n", version.Get())
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.CommandLine.Args())
		os.Exit(1)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
