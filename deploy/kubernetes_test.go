package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       yaml.Node         `yaml:"spec"`
	file       string
}

type deploymentSpec struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
			Containers                    []k8sContainer `yaml:"containers"`
			Volumes                       []struct {
				Name      string `yaml:"name"`
				ConfigMap *struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sContainer struct {
	Name         string `yaml:"name"`
	Image        string `yaml:"image"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
	Env []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string     `yaml:"path"`
		Port portOrName `yaml:"port"`
	} `yaml:"httpGet"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		Name       string     `yaml:"name"`
		Port       int        `yaml:"port"`
		TargetPort portOrName `yaml:"targetPort"`
	} `yaml:"ports"`
}

// portOrName is a Kubernetes IntOrString port: a number or a port name.
type portOrName string

func (p *portOrName) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: port must be a number or a name", n.Line)
	}
	*p = portOrName(n.Value)
	return nil
}

// resolve returns the container port that p names in c (0 if none).
func (p portOrName) resolve(c k8sContainer) int {
	if n, err := strconv.Atoi(string(p)); err == nil {
		for _, cp := range c.Ports {
			if cp.ContainerPort == n {
				return n
			}
		}
		return 0
	}
	for _, cp := range c.Ports {
		if cp.Name == string(p) {
			return cp.ContainerPort
		}
	}
	return 0
}

// loadK8s reads every document of every deploy/kubernetes/*.yaml file.
func loadK8s(t *testing.T) ([]k8sObject, map[string][]byte) {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files in %s (%v)", dir, err)
	}
	var objs []k8sObject
	raws := map[string][]byte{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel := "deploy/kubernetes/" + filepath.Base(f)
		raws[rel] = raw
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for i := 1; ; i++ {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s document %d: %v", rel, i, err)
			}
			if o.Kind == "" {
				continue // an empty document
			}
			o.file = rel
			objs = append(objs, o)
		}
	}
	return objs, raws
}

// configMapNamed returns the ConfigMap called name.
func configMapNamed(t *testing.T, objs []k8sObject, name string) k8sObject {
	t.Helper()
	for _, o := range objs {
		if o.Kind == "ConfigMap" && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("deploy/kubernetes has no ConfigMap %s", name)
	return k8sObject{}
}

// onlyKind returns the single object of a kind.
func onlyKind(t *testing.T, objs []k8sObject, kind string) k8sObject {
	t.Helper()
	var found []k8sObject
	for _, o := range objs {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("deploy/kubernetes has %d objects of kind %s, want 1", len(found), kind)
	}
	return found[0]
}

func TestKubernetesSidecar(t *testing.T) {
	objs, raws := loadK8s(t)
	known := knownVars(t)
	for file, raw := range raws {
		checkVars(t, file, raw, known)
	}
	checkVars(t, "deploy/kubernetes/README.md", readRepoFile(t, "deploy/kubernetes/README.md"), known)

	cm := configMapNamed(t, objs, "orders-idemproxy")
	secret := onlyKind(t, objs, "Secret")
	deployObj := onlyKind(t, objs, "Deployment")
	svcObj := onlyKind(t, objs, "Service")

	secretKeys := []string{"IDEMPROXY_DATABASE_URL", "IDEMPROXY_JWT_HS256_SECRET", "IDEMPROXY_ADMIN_TOKEN"}
	t.Run("config and secrets", func(t *testing.T) {
		for k := range cm.Data {
			if !strings.HasPrefix(k, "IDEMPROXY_") {
				t.Errorf("ConfigMap key %q is not an IDEMPROXY_* variable", k)
			}
		}
		for _, k := range secretKeys {
			if _, ok := cm.Data[k]; ok {
				t.Errorf("ConfigMap holds %s: secrets belong in the Secret", k)
			}
			if secret.StringData[k] == "" && secret.Data[k] == "" {
				t.Errorf("Secret %s has no %s", secret.Metadata.Name, k)
			}
		}
		if s := secret.StringData["IDEMPROXY_JWT_HS256_SECRET"]; s != "" && len(s) < 32 {
			t.Errorf("IDEMPROXY_JWT_HS256_SECRET placeholder is %d bytes; Config rejects fewer than 32", len(s))
		}
	})

	var dep deploymentSpec
	if err := deployObj.Spec.Decode(&dep); err != nil {
		t.Fatalf("%s: Deployment spec: %v", deployObj.file, err)
	}
	var sidecar *k8sContainer
	var legacy []k8sContainer
	for i, c := range dep.Template.Spec.Containers {
		name, _, _ := strings.Cut(c.Image, ":")
		if name == "ghcr.io/idemproxy/idemproxy" {
			if sidecar != nil {
				t.Fatal("Deployment has two idemproxy containers")
			}
			sidecar = &dep.Template.Spec.Containers[i]
		} else {
			legacy = append(legacy, c)
		}
	}
	if sidecar == nil {
		t.Fatalf("Deployment has no container with image ghcr.io/idemproxy/idemproxy (containers: %+v)", dep.Template.Spec.Containers)
	}
	if len(legacy) == 0 {
		t.Fatal("Deployment has no legacy service container beside the sidecar")
	}

	// The sidecar's effective settings: Config defaults, then the
	// ConfigMap, then the container's own env.
	settings := configDefaults(t)
	for k, v := range cm.Data {
		settings[k] = v
	}
	for _, e := range sidecar.Env {
		settings[e.Name] = e.Value
	}
	// The routes file: the ConfigMap mounted where IDEMPROXY_ROUTES_FILE
	// points, written out so that `idemproxy config` validates it.
	routesFile, routesDir := "", t.TempDir()
	t.Run("routes file mounted from a ConfigMap", func(t *testing.T) {
		path := settings["IDEMPROXY_ROUTES_FILE"]
		if path == "" {
			t.Fatal("the sidecar has no IDEMPROXY_ROUTES_FILE")
		}
		dir, base := filepath.Dir(path), filepath.Base(path)
		var volume string
		for _, m := range sidecar.VolumeMounts {
			if m.MountPath == dir && m.SubPath == "" {
				volume = m.Name
			}
		}
		if volume == "" {
			t.Fatalf("no volume is mounted (without subPath, so that updates reach it) at %s, the directory of IDEMPROXY_ROUTES_FILE", dir)
		}
		var cmName string
		for _, v := range dep.Template.Spec.Volumes {
			if v.Name == volume && v.ConfigMap != nil {
				cmName = v.ConfigMap.Name
			}
		}
		if cmName == "" {
			t.Fatalf("volume %s is not a ConfigMap volume", volume)
		}
		content := configMapNamed(t, objs, cmName).Data[base]
		if content == "" {
			t.Fatalf("ConfigMap %s has no key %s", cmName, base)
		}
		routesFile = filepath.Join(routesDir, base)
		if err := os.WriteFile(routesFile, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"IDEMPROXY_STORE_TIMEOUT": settings["IDEMPROXY_STORE_TIMEOUT"],
			"IDEMPROXY_LOCK_TIMEOUT": settings["IDEMPROXY_LOCK_TIMEOUT"], "IDEMPROXY_UPSTREAM_TIMEOUT": settings["IDEMPROXY_UPSTREAM_TIMEOUT"],
			"IDEMPROXY_MAX_BODY_BYTES": settings["IDEMPROXY_MAX_BODY_BYTES"], "IDEMPROXY_MAX_BUFFERED_BYTES": settings["IDEMPROXY_MAX_BUFFERED_BYTES"]}
		if out, err := routesCheck(env, routesFile); err != nil || !strings.Contains(out, "CreatePayment") {
			t.Fatalf("idemproxy routes check refuses the ConfigMap's routes file: %v\n%s", err, out)
		}
	})
	t.Run("grace period covers the drain", func(t *testing.T) {
		env := map[string]string{}
		for k, v := range settings {
			env[k] = v
		}
		if routesFile != "" {
			env["IDEMPROXY_ROUTES_FILE"] = routesFile
		}
		env["IDEMPROXY_DATABASE_URL"] = "postgres://placeholder/db" // from the Secret
		_, drain := configured(t, env)
		grace := dep.Template.Spec.TerminationGracePeriodSeconds
		if grace == nil || time.Duration(*grace)*time.Second < drain {
			t.Fatalf("terminationGracePeriodSeconds %v is shorter than the drain budget %s", grace, drain)
		}
	})
	proxyPort := portOf(t, "IDEMPROXY_LISTEN_ADDR", settings["IDEMPROXY_LISTEN_ADDR"])
	adminPort := portOf(t, "IDEMPROXY_ADMIN_ADDR", settings["IDEMPROXY_ADMIN_ADDR"])

	t.Run("sidecar", func(t *testing.T) {
		var cmRef, secretRef bool
		for _, ef := range sidecar.EnvFrom {
			cmRef = cmRef || (ef.ConfigMapRef != nil && ef.ConfigMapRef.Name == cm.Metadata.Name)
			secretRef = secretRef || (ef.SecretRef != nil && ef.SecretRef.Name == secret.Metadata.Name)
		}
		if !cmRef || !secretRef {
			t.Errorf("sidecar envFrom must name ConfigMap %q and Secret %q", cm.Metadata.Name, secret.Metadata.Name)
		}
		for _, p := range []portOrName{portOrName(strconv.Itoa(proxyPort)), portOrName(strconv.Itoa(adminPort))} {
			if p.resolve(*sidecar) == 0 {
				t.Errorf("sidecar does not declare containerPort %s", p)
			}
		}
		for _, pr := range []struct {
			name  string
			probe *k8sProbe
			path  string
		}{{"livenessProbe", sidecar.LivenessProbe, "/healthz"}, {"readinessProbe", sidecar.ReadinessProbe, "/readyz"}} {
			if pr.probe == nil || pr.probe.HTTPGet == nil {
				t.Errorf("sidecar has no %s httpGet", pr.name)
				continue
			}
			if pr.probe.HTTPGet.Path != pr.path {
				t.Errorf("%s path = %q, want %s", pr.name, pr.probe.HTTPGet.Path, pr.path)
			}
			if got := pr.probe.HTTPGet.Port.resolve(*sidecar); got != adminPort {
				t.Errorf("%s port %q is container port %d, want the admin port %d", pr.name, pr.probe.HTTPGet.Port, got, adminPort)
			}
		}
		r := sidecar.Resources
		if r.Requests["cpu"] == "" || r.Requests["memory"] == "" || r.Limits["memory"] == "" {
			t.Errorf("sidecar resources = %+v, want cpu and memory requests and a memory limit", r)
		}
		sc := sidecar.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("sidecar securityContext must set runAsNonRoot: true, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false")
		}
	})

	t.Run("upstream is the legacy container on localhost", func(t *testing.T) {
		host, port := urlPort(t, "IDEMPROXY_UPSTREAM_URL", settings["IDEMPROXY_UPSTREAM_URL"])
		if host != "127.0.0.1" && host != "localhost" {
			t.Errorf("IDEMPROXY_UPSTREAM_URL host = %q, want 127.0.0.1: the legacy container shares the pod's network", host)
		}
		if port == proxyPort || port == adminPort {
			t.Errorf("IDEMPROXY_UPSTREAM_URL port %d collides with the sidecar's own ports", port)
		}
		var bound bool
		for _, c := range legacy {
			for _, e := range c.Env {
				bound = bound || e.Value == net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) || e.Value == "localhost:"+strconv.Itoa(port)
			}
		}
		if !bound {
			t.Errorf("no legacy container is configured to listen on 127.0.0.1:%d", port)
		}
	})

	t.Run("service targets the sidecar proxy port", func(t *testing.T) {
		var svc serviceSpec
		if err := svcObj.Spec.Decode(&svc); err != nil {
			t.Fatalf("%s: Service spec: %v", svcObj.file, err)
		}
		if len(svc.Ports) == 0 {
			t.Fatal("Service has no ports")
		}
		for k, v := range svc.Selector {
			if dep.Template.Metadata.Labels[k] != v {
				t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, dep.Template.Metadata.Labels)
			}
		}
		for _, p := range svc.Ports {
			if got := p.TargetPort.resolve(*sidecar); got != proxyPort {
				t.Errorf("Service port %d targetPort %q is sidecar port %d, want the proxy port %d", p.Port, p.TargetPort, got, proxyPort)
			}
			for _, c := range legacy {
				if p.TargetPort.resolve(c) != 0 {
					t.Errorf("Service targetPort %q reaches legacy container %s around the proxy", p.TargetPort, c.Name)
				}
			}
		}
	})
}
