package main

// The `designs` mode: what one pod CREATE costs kube-apiserver's admission policy for each way
// of giving it ipkeep's plan, at the shapes of docs/benchmarks.md. Per design and shape it builds
// the parameter objects the binding would select in the pod's namespace and, per pod, does what
// the dispatcher does for each of them: converts the parameter to CEL values
// (common.SchemalessTypedToVal, as cel/activation.go) and evaluates an expression that reads what
// ipkeep's policy reads (the owner's entries and the pod's), compiled in kube-apiserver's own CEL
// environment. The pod is converted once per activation too. Designs:
//
//	pps          the PersistentPodStates themselves (records and plan): 0.2.0's policy
//	plan-object  a custom resource per StatefulSet with the plan only (no records)
//	cm-per-sts   a ConfigMap per StatefulSet, selected by a label (one activation each)
//	cm-per-ns    one ConfigMap per namespace, ipkeep-admission-plan (0.3.0's policy)

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/cel-go/cel"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/cel/common"
	"k8s.io/apiserver/pkg/cel/environment"
)

type shape struct {
	name         string
	statefulSets int
	replicas     int
}

var shapes = []shape{{"1 x 1000", 1, 1000}, {"200 x 5", 200, 5}, {"1 x 10", 1, 10}}

const crExpr = `has(params.status) && has(params.status.admission) &&
  params.spec.targetRef.name == object.metadata.ownerReferences[0].name &&
  params.status.admission.statefulSetUID == object.metadata.ownerReferences[0].uid &&
  object.metadata.name in params.status.admission.pods ?
    params.status.admission.pods[object.metadata.name].nodeSelector : {}`

const planObjectExpr = `params.spec.statefulSet == object.metadata.ownerReferences[0].name &&
  params.spec.statefulSetUID == object.metadata.ownerReferences[0].uid &&
  object.metadata.name in params.spec.pods ? params.spec.pods[object.metadata.name].nodeSelector : {}`

const cmExpr = `params.data[?('uid.' + object.metadata.ownerReferences[0].name)].orValue('') ==
  object.metadata.ownerReferences[0].uid ?
    params.data[?('pod.' + object.metadata.name)].orValue('').split('|')[0] : ''`

func designs() error {
	env, err := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()).Extend(
		environment.VersionedOptions{
			IntroducedVersion: environment.DefaultCompatibilityVersion(),
			EnvOptions:        []cel.EnvOption{cel.Variable("params", cel.DynType), cel.Variable("object", cel.DynType)},
		})
	if err != nil {
		return err
	}
	programs := map[string]cel.Program{}
	for name, expr := range map[string]string{"pps": crExpr, "plan-object": planObjectExpr, "cm-per-sts": cmExpr, "cm-per-ns": cmExpr} {
		ast, iss := env.StoredExpressionsEnv().Compile(expr)
		if iss.Err() != nil {
			return fmt.Errorf("%s: %w", name, iss.Err())
		}
		p, err := env.StoredExpressionsEnv().Program(ast)
		if err != nil {
			return err
		}
		programs[name] = p
	}
	fmt.Printf("%-10s %-12s %8s %12s %14s\n", "shape", "design", "params", "param bytes", "us per CREATE")
	for _, s := range shapes {
		for _, d := range []string{"pps", "plan-object", "cm-per-sts", "cm-per-ns"} {
			params := build(d, s)
			size := 0
			for _, p := range params {
				b, _ := json.Marshal(p)
				size += len(b)
			}
			pod := podOf(s.statefulSets-1, s.replicas-1)
			us := perCreate(programs[d], params, pod)
			fmt.Printf("%-10s %-12s %8d %12d %14.1f\n", s.name, d, len(params), size, us)
		}
	}
	return nil
}

// perCreate returns the mean microseconds of one pod CREATE's activations, over at least a second.
func perCreate(p cel.Program, params []any, pod *corev1.Pod) float64 {
	once := func() {
		for _, param := range params {
			vars := map[string]any{
				"params": common.SchemalessTypedToVal(param),
				"object": common.SchemalessTypedToVal(pod),
			}
			if _, _, err := p.Eval(vars); err != nil {
				panic(err)
			}
		}
	}
	once()
	start := time.Now()
	n := 0
	for time.Since(start) < time.Second || n < 5 {
		once()
		n++
	}
	return float64(time.Since(start).Nanoseconds()) / 1000 / float64(n)
}

func stsName(i int) string { return fmt.Sprintf("sts-%03d", i) }
func stsUID(i int) string  { return fmt.Sprintf("6a1e4f0c-0000-4000-8000-%012d", i) }
func nodeOf(i, o int) string {
	return fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", i%250, o/250, o%250)
}

func podOf(i, o int) *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%d", stsName(i), o), Namespace: "bench",
			Labels: map[string]string{"app": stsName(i), "statefulset.kubernetes.io/pod-name": fmt.Sprintf("%s-%d", stsName(i), o)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet",
				Name: stsName(i), UID: types.UID(stsUID(i)), Controller: &yes}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

// build returns the parameter objects design d puts in a namespace of shape s.
func build(d string, s shape) []any {
	var out []any
	switch d {
	case "pps", "plan-object":
		for i := 0; i < s.statefulSets; i++ {
			pods := map[string]any{}
			records := map[string]any{}
			for o := 0; o < s.replicas; o++ {
				name := fmt.Sprintf("%s-%d", stsName(i), o)
				pods[name] = map[string]any{
					"annotations":  map[string]any{"ipkeep.dev/pinned-by": stsName(i)},
					"nodeSelector": map[string]any{"kubernetes.io/hostname": nodeOf(i, o)},
				}
				records[name] = map[string]any{
					"nodeName":           nodeOf(i, o),
					"nodeTopologyLabels": map[string]any{"kubernetes.io/hostname": nodeOf(i, o)},
					"podIPs":             []any{fmt.Sprintf("10.244.%d.%d", o/250, o%250)},
					"podUID":             fmt.Sprintf("0f6c1d2e-0000-4000-8000-%012d", o),
					"recordedAt":         "2026-11-28T10:00:00Z",
				}
			}
			plan := map[string]any{
				"statefulSetUID": stsUID(i),
				"annotations":    map[string]any{"ipkeep.dev/persistent-pod-state": stsName(i), "ipkeep.dev/ip-retention": "24h"},
				"pods":           pods,
				"decidedOn":      map[string]any{},
			}
			var obj map[string]any
			if d == "pps" {
				obj = map[string]any{
					"apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
					"metadata": map[string]any{"name": stsName(i), "namespace": "bench"},
					"spec":     map[string]any{"targetRef": map[string]any{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": stsName(i)}},
					"status":   map[string]any{"targetUID": stsUID(i), "podStates": records, "admission": plan},
				}
			} else {
				plan["statefulSet"] = stsName(i)
				obj = map[string]any{
					"apiVersion": "ipkeep.dev/v1alpha1", "kind": "AdmissionPlan",
					"metadata": map[string]any{"name": stsName(i), "namespace": "bench"},
					"spec":     plan,
				}
			}
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	case "cm-per-sts", "cm-per-ns":
		var cm *corev1.ConfigMap
		for i := 0; i < s.statefulSets; i++ {
			if cm == nil || d == "cm-per-sts" {
				cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ipkeep-admission-plan", Namespace: "bench",
					Labels: map[string]string{"ipkeep.dev/admission-plan": "true"}}, Data: map[string]string{}}
				if d == "cm-per-sts" {
					cm.Name = stsName(i)
				}
				out = append(out, cm)
			}
			cm.Data["uid."+stsName(i)] = stsUID(i)
			cm.Data["pps."+stsName(i)] = stsName(i)
			cm.Data["ann."+stsName(i)] = "ipkeep.dev/ip-retention=24h\nipkeep.dev/persistent-pod-state=" + stsName(i)
			cm.Data["keys."+stsName(i)] = "kubernetes.io/hostname"
			cm.Data["on."+stsName(i)] = "\n\n"
			for o := 0; o < s.replicas; o++ {
				cm.Data[fmt.Sprintf("pod.%s-%d", stsName(i), o)] = "0=" + nodeOf(i, o) + "|"
			}
		}
	}
	return out
}
