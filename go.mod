module github.com/vgpu/vgpu

go 1.26
