{{/* The image of every component: repository:tag, or repository@digest when a digest is given. */}}
{{- define "ipkeep.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The scheduler-ext Service's DNS name, which the certificate and the extender name. */}}
{{- define "ipkeep.schedulerExtHost" -}}
ipkeep-scheduler-ext.{{ include "ipkeep.namespace" . }}.svc
{{- end -}}

{{/* The webhooks' namespaceSelector: never the release namespace, the excluded ones, or a
namespace labelled ipkeep.dev/webhook=disabled. */}}
{{- define "ipkeep.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ concat .Values.webhook.excludedNamespaces (list (include "ipkeep.namespace" .)) | uniq | toJson }}
    - key: ipkeep.dev/webhook
      operator: NotIn
      values: ["disabled"]
{{- end -}}

{{/* "true" when new StatefulSet pods get their pin from the MutatingAdmissionPolicy ipkeep-pin
inside the API server rather than from the mutating webhook (value admission.mode). */}}
{{- define "ipkeep.admissionPolicy" -}}
{{- $mode := .Values.admission.mode -}}
{{- if not (has $mode (list "auto" "policy" "webhook")) -}}
{{- fail (printf "admission.mode is %q; use auto, policy or webhook" $mode) -}}
{{- end -}}
{{- if or (eq $mode "policy") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when ipkeep-controller makes the webhook's certificates (selfManagedCertificates,
unless cert-manager makes them), else empty. */}}
{{- define "ipkeep.selfManagedCertificates" -}}
{{- if and .Values.selfManagedCertificates.enabled (not .Values.certManager.enabled) -}}
true
{{- end -}}
{{- end -}}

{{/* The webhook configurations' annotations: cert-manager's CA injection when it is used. */}}
{{- define "ipkeep.webhookAnnotations" -}}
{{- if .Values.certManager.enabled }}
  annotations:
    cert-manager.io/inject-ca-from: {{ include "ipkeep.namespace" . }}/ipkeep-scheduler-ext
{{- end }}
{{- end -}}

{{/* clientConfig of a webhook on PATH. */}}
{{- define "ipkeep.webhookClientConfig" -}}
clientConfig:
  service:
    namespace: {{ (include "ipkeep.namespace" .root) }}
    name: ipkeep-scheduler-ext
    path: {{ .path }}
    port: 443
  {{- with .root.Values.webhook.caBundle }}
  caBundle: {{ . }}
  {{- end }}
{{- end -}}

{{/* The `extenders` stanza of kube-scheduler's KubeSchedulerConfiguration (NOTES.txt prints
it; deploy/scheduler-ext/scheduler-config.yaml is rendered with it). */}}
{{- define "ipkeep.schedulerExtenders" -}}
extenders:
  - urlPrefix: https://{{ .Values.schedulerExt.service.clusterIP | default (include "ipkeep.schedulerExtHost" .) }}:443
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: 1
    nodeCacheCapable: true
    ignorable: true
    httpTimeout: 2s
    enableHTTPS: true
    tlsConfig:
      caFile: /etc/kubernetes/pki/ipkeep-scheduler-ext-ca.crt
      serverName: {{ include "ipkeep.schedulerExtHost" . }}
{{- end -}}

{{/* The node CNI configuration (values `cni`): a bridge network with ipkeep IPAM. JSON, written
by hand rather than with toPrettyJson, to keep the keys in the order people read them. */}}
{{- define "ipkeep.cniConflist" -}}
{{- $ipam := .Values.cni.ipam -}}
{
  "cniVersion": {{ .Values.cni.cniVersion | toJson }},
  "name": {{ .Values.cni.name | toJson }},
  "plugins": [
    {
      "type": "bridge",
      "bridge": {{ .Values.cni.bridge | toJson }},
      "isGateway": true,
      "ipMasq": {{ .Values.cni.ipMasq | toJson }},
      "hairpinMode": {{ .Values.cni.hairpinMode | toJson }},
      "capabilities": {
        "io.kubernetes.cri.pod-annotations": true,
        "ips": true
      },
      "ipam": {
        "type": "ipkeep",
        "ranges": [
          {{- range $i, $set := .Values.cni.ranges }}{{ if $i }},{{ end }}
          [{{ range $j, $r := $set }}{{ if $j }}, {{ end }}{{ $r | toJson }}{{ end }}]
          {{- end }}
        ],
        "routes": [{{ range $i, $r := .Values.cni.routes }}{{ if $i }}, {{ end }}{{ $r | toJson }}{{ end }}],
        "dataDir": {{ .Values.agent.dataDir | toJson }},
        {{- if ne .Values.agent.socketDir "/run/ipkeep" }}
        "agentSocket": {{ printf "%s/agent.sock" .Values.agent.socketDir | toJson }},
        {{- end }}
        "retention": {{ $ipam.retention | toJson }},
        {{- with $ipam.reuseCooldown }}
        "reuseCooldown": {{ . | toJson }},
        {{- end }}
        "lockTimeout": {{ $ipam.lockTimeout | toJson }},
        "logFile": {{ $ipam.logFile | toJson }}
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
{{- end -}}

{{/* The labels of every object (dict: root, and name and component where the object has
them): the standard app.kubernetes.io labels, helm.sh/chart, and commonLabels (which cannot
replace a standard one). Helm adds app.kubernetes.io/managed-by itself. Selectors use
app.kubernetes.io/name alone, so that changing any of these never breaks an upgrade. */}}
{{- define "ipkeep.labels" -}}
{{- $root := .root -}}
{{- $labels := dict "app.kubernetes.io/part-of" "ipkeep" "app.kubernetes.io/instance" $root.Release.Name "app.kubernetes.io/version" ($root.Chart.AppVersion | toString) "helm.sh/chart" (printf "%s-%s" $root.Chart.Name ($root.Chart.Version | replace "+" "_")) -}}
{{- with .name }}{{ $_ := set $labels "app.kubernetes.io/name" . }}{{ end -}}
{{- with .component }}{{ $_ := set $labels "app.kubernetes.io/component" . }}{{ end -}}
{{- toYaml (merge $labels ($root.Values.commonLabels | default dict)) -}}
{{- end -}}

{{/* The metadata of a component's pods (dict: root, name, component, values: the component's
values): its labels with podLabels (which cannot replace them), and podAnnotations. */}}
{{- define "ipkeep.podMetadata" -}}
{{- $labels := include "ipkeep.labels" . | fromYaml -}}
labels:
  {{- toYaml (merge $labels (.values.podLabels | default dict)) | nindent 2 }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The namespace every component runs in: namespace.name, else the release namespace. */}}
{{- define "ipkeep.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* A duration of the schema's form (1h30m, 365d) in seconds; below a second counts as 0. */}}
{{- define "ipkeep.seconds" -}}
{{- $total := 0 -}}
{{- $units := dict "s" 1 "m" 60 "h" 3600 "d" 86400 -}}
{{- range regexFindAll "[0-9]+(ns|us|ms|s|m|h|d)" . -1 -}}
{{- $n := regexFind "^[0-9]+" . -}}
{{- $unit := trimPrefix $n . -}}
{{- $total = add $total (mul (atoi $n) (get $units $unit | default 0)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The rules between values that the schema cannot state; each fails the render, naming the
values. Included (it renders nothing) by controller/deployment.yaml. */}}
{{- define "ipkeep.checks" -}}
{{- $certs := .Values.selfManagedCertificates -}}
{{- if include "ipkeep.selfManagedCertificates" . -}}
{{- if le (atoi (include "ipkeep.seconds" $certs.caValidity)) (atoi (include "ipkeep.seconds" $certs.certificateValidity)) -}}
{{- fail (printf "selfManagedCertificates.caValidity (%s) must be longer than selfManagedCertificates.certificateValidity (%s): the CA signs the serving certificate, which cannot outlive it" $certs.caValidity $certs.certificateValidity) -}}
{{- end -}}
{{- end -}}
{{- end -}}
