module github.com/vgpu/vgpu

go 1.26.0

require (
	github.com/sirupsen/logrus v1.10.2 // indirect
	golang.org/x/sys v0.50.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
