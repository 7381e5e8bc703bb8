// Command policy-params times what kube-apiserver does with an admission policy's parameter
// object at every activation of the policy: common.SchemalessTypedToVal, which turns the object
// into CEL values. A custom resource reaches it as *unstructured.Unstructured, whose
// MarshalJSON makes the conversion a JSON round trip of the whole object; kube-apiserver makes
// one activation per matching parameter for the policy's matchConditions (if it has any) and one
// per mutation. Used by scripts/bench-policy-params.sh (docs/benchmarks.md).
//
//	policy-params PPS.json...
//	policy-params designs
//
// For each PersistentPodState (as `kubectl get pps NAME -o json` prints it) it prints the
// conversion time of the object as it is, without status.podStates (the records), and without
// status.admission (the plan): the compact JSON size and the mean over repeated conversions.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/cel/common"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: policy-params PPS.json... (kubectl get pps NAME -o json) | policy-params designs")
		os.Exit(2)
	}
	if os.Args[1] == "designs" {
		if err := designs(); err != nil {
			fmt.Fprintf(os.Stderr, "policy-params: %v\n", err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("%-28s %-22s %10s %12s\n", "file", "object", "bytes", "ms/convert")
	for _, file := range os.Args[1:] {
		if err := report(file); err != nil {
			fmt.Fprintf(os.Stderr, "policy-params: %s: %v\n", file, err)
			os.Exit(1)
		}
	}
}

func report(file string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	variants := []struct {
		name string
		drop string
	}{{"as stored", ""}, {"without podStates", "podStates"}, {"without admission", "admission"}}
	for _, v := range variants {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(raw, &u.Object); err != nil {
			return fmt.Errorf("not a JSON object: %w", err)
		}
		if v.drop != "" {
			unstructured.RemoveNestedField(u.Object, "status", v.drop)
		}
		compact, err := json.Marshal(u.Object)
		if err != nil {
			return err
		}
		fmt.Printf("%-28s %-22s %10d %12.3f\n", file, v.name, len(compact), convert(u))
	}
	return nil
}

// convert returns the mean time of one conversion in milliseconds, over at least a second.
func convert(u *unstructured.Unstructured) float64 {
	common.SchemalessTypedToVal(u)
	start := time.Now()
	n := 0
	for time.Since(start) < time.Second || n < 10 {
		common.SchemalessTypedToVal(u)
		n++
	}
	return float64(time.Since(start).Microseconds()) / 1000 / float64(n)
}
